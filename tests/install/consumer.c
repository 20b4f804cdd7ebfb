/* install.consumers: a C program built against an installed lowcomm the way a user builds one,
 *   cc consumer.c $(pkg-config --cflags --libs lowcomm)
 * (and once against liblowcomm.a with pkg-config --static). It checks lowcommGetVersion
 * against the header, then runs two ranks on loopback through the C API (rank 1 a fork()ed
 * child): a blocking fp32 sum that must be exact, and an asynchronous q8 average within the
 * codec's error bound. Exit status 0 when every check holds. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lowcomm/lowcomm.h"

#define N 5000 /* not a multiple of the 128-element block */

static int failed(const char* what, lowcommResult_t r, lowcommComm_t comm) {
  fprintf(stderr, "consumer.c: %s: %s: %s\n", what, lowcommGetErrorString(r),
          lowcommGetLastError(comm));
  return 1;
}

/* Exact in fp32 (multiples of 1/4 below 2^10), so the sum of two is exact too. */
static float exact_value(int rank, int i) {
  return (float)(rank + 1) * 0.25f + (float)(i % 97) - 48.0f;
}

/* A reproducible value in [-1, 1) that needs rounding on the q8 grid. */
static float noisy_value(int rank, int i) {
  unsigned x = (unsigned)i * 2654435761u + (unsigned)rank * 40503u + 12345u;
  x ^= x >> 13;
  x *= 2246822519u;
  x ^= x >> 16;
  return (float)(x & 0xffffu) / 32768.0f - 1.0f;
}

static float absf(float x) {
  return x < 0 ? -x : x;
}

static int run_rank(int rank, lowcommUniqueId id) {
  lowcommComm_t comm = NULL;
  lowcommResult_t r = lowcommCommInitRank(&comm, 2, id, rank);
  if (r != lowcommSuccess) return failed("lowcommCommInitRank", r, NULL);
  int count = 0, me = -1;
  if ((r = lowcommCommCount(comm, &count)) != lowcommSuccess || count != 2)
    return failed("lowcommCommCount", r, comm);
  if ((r = lowcommCommUserRank(comm, &me)) != lowcommSuccess || me != rank)
    return failed("lowcommCommUserRank", r, comm);

  static float x[N], y[N], avg[N];
  for (int i = 0; i < N; ++i) x[i] = exact_value(rank, i);
  r = lowcommAllReduce(x, x, N, lowcommFloat32, lowcommSum, NULL, comm, NULL);
  if (r != lowcommSuccess) return failed("lowcommAllReduce (sum)", r, comm);
  for (int i = 0; i < N; ++i) {
    float want = exact_value(0, i) + exact_value(1, i);
    if (x[i] != want) {
      fprintf(stderr, "consumer.c: rank %d: sum[%d] = %g, want %g\n", rank, i, x[i], want);
      return 1;
    }
  }

  /* q8 average: each rank's contribution and the owner's result are quantized once each, on
   * an absmax grid of step A/128 with |A| <= 1 (per-step error at most one step, docs/codecs.md),
   * so the average is off by at most 2/128 here. */
  for (int i = 0; i < N; ++i) y[i] = noisy_value(rank, i);
  lowcommRequest_t req = NULL;
  r = lowcommAllReduce(y, avg, N, lowcommFloat32, lowcommAvg, "q8", comm, &req);
  if (r != lowcommSuccess) return failed("lowcommAllReduce (q8 avg)", r, comm);
  if ((r = lowcommWait(req)) != lowcommSuccess) return failed("lowcommWait", r, comm);
  const float bound = 2.0f / 128 * 1.001f; /* and a few ulps */
  float worst = 0;
  for (int i = 0; i < N; ++i) {
    float err = absf(avg[i] - (noisy_value(0, i) + noisy_value(1, i)) / 2);
    if (!(err <= bound)) { /* NaN too */
      fprintf(stderr, "consumer.c: rank %d: q8 avg[%d] off by %g (bound %g)\n", rank, i, err,
              bound);
      return 1;
    }
    if (err > worst) worst = err;
  }
  if (worst == 0) {
    fprintf(stderr, "consumer.c: rank %d: the q8 average is exact: not quantized?\n", rank);
    return 1;
  }
  if ((r = lowcommCommDestroy(comm)) != lowcommSuccess)
    return failed("lowcommCommDestroy", r, NULL);
  printf("consumer.c: rank %d: sum exact, q8 average within %g\n", rank, worst);
  fflush(stdout); /* rank 1 leaves through _exit */
  return 0;
}

int main(void) {
  int version = -1;
  lowcommResult_t r = lowcommGetVersion(&version);
  if (r != lowcommSuccess) return failed("lowcommGetVersion", r, NULL);
  if (version != LOWCOMM_VERSION_CODE ||
      LOWCOMM_VERSION_CODE != LOWCOMM_VERSION(LOWCOMM_MAJOR, LOWCOMM_MINOR, LOWCOMM_PATCH)) {
    fprintf(stderr, "consumer.c: library version %d, header %d\n", version, LOWCOMM_VERSION_CODE);
    return 1;
  }
  if (lowcommGetVersion(NULL) != lowcommInvalidArgument) {
    fprintf(stderr, "consumer.c: lowcommGetVersion(NULL) was not refused\n");
    return 1;
  }
  printf("consumer.c: lowcomm %d.%d.%d (%d)\n", LOWCOMM_MAJOR, LOWCOMM_MINOR, LOWCOMM_PATCH,
         version);

  lowcommUniqueId id;
  if ((r = lowcommGetUniqueIdAt("127.0.0.1", &id)) != lowcommSuccess)
    return failed("lowcommGetUniqueIdAt", r, NULL);
  fflush(stdout);
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    return 1;
  }
  if (child == 0) _exit(run_rank(1, id));
  int rc = run_rank(0, id);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "consumer.c: rank 1 failed (status %d)\n", status);
    rc = 1;
  }
  return rc;
}
