/* lowcomm C API, named and shaped like NCCL's (nccl.h), plus codec arguments.
 *
 *   lowcommUniqueId id;  lowcommGetUniqueId(&id);           // rank 0; distribute the bytes
 *   lowcommComm_t comm;  lowcommCommInitRank(&comm, nranks, id, rank);
 *   lowcommRequest_t req;
 *   lowcommAllReduce(x, x, n, lowcommFloat32, lowcommAvg, "q4", comm, &req);
 *   lowcommWait(req);                                       // frees req
 *   lowcommCommDestroy(comm);
 *
 * Every operation on host buffers is asynchronous when `request` is non-NULL (complete it with
 * lowcommWait, or lowcommTest until done, which frees it) and blocking when it is NULL; the
 * *OnStream calls on CUDA buffers return once their operation has completed, either way. Operations
 * run in call order. Buffers stay in use until the request completes. The first failure breaks the
 * communicator (as in NCCL): later calls return the same error; lowcommGetLastError(comm) has
 * the text, naming the peer and the operation. No C++ exception crosses this API.
 *
 * Arguments that are wrong on this rank alone (a peer or root outside the communicator, a peer
 * equal to the caller's rank, a NULL buffer with a non-zero count, a bad codec or a count it
 * cannot take, a count too large) make the call return lowcommInvalidArgument at once, as
 * NCCL's ncclInvalidArgument: no request is set, nothing is sent, and the communicator stays
 * usable. lowcommGetLastError(comm) says what was wrong.
 */
#ifndef LOWCOMM_LOWCOMM_H_
#define LOWCOMM_LOWCOMM_H_

#include <stddef.h>
#include <stdint.h>

#include "lowcomm/export.h"
#include "lowcomm/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOWCOMM_UNIQUE_ID_BYTES 128
#define LOWCOMM_UNIQUE_ID_STRING_BYTES 256 /* enough for lowcommUniqueIdToString */

typedef enum {
  lowcommSuccess = 0,
  lowcommUnhandledCudaError = 1,
  lowcommSystemError = 2,
  lowcommInternalError = 3,
  lowcommInvalidArgument = 4,
  lowcommInvalidUsage = 5,
  lowcommRemoteError = 6,
  lowcommInProgress = 7,
  lowcommTimeout = 8,      /* lowcomm: an operation's deadline passed */
  lowcommAborted = 9,      /* lowcomm: lowcommCommAbort */
  lowcommCorruptData = 10, /* lowcomm: received bytes failed validation */
  lowcommUnsupported = 11,
  lowcommFenced = 12, /* lowcomm: an elastic member cut off from its group for good (rejoin) */
  lowcommNumResults = 13
} lowcommResult_t;

/* Values as NCCL's ncclDataType_t; lowcommInt16 and lowcommBool (one byte, 0 or 1) are
 * lowcomm's own. Codecs take lowcommFloat32, lowcommFloat16 and lowcommBfloat16. */
typedef enum {
  lowcommInt8 = 0,
  lowcommChar = 0,
  lowcommUint8 = 1,
  lowcommInt32 = 2,
  lowcommInt = 2,
  lowcommUint32 = 3,
  lowcommInt64 = 4,
  lowcommUint64 = 5,
  lowcommFloat16 = 6,
  lowcommHalf = 6,
  lowcommFloat32 = 7,
  lowcommFloat = 7,
  lowcommFloat64 = 8,
  lowcommDouble = 8,
  lowcommBfloat16 = 9,
  lowcommInt16 = 64, /* lowcomm */
  lowcommBool = 65   /* lowcomm */
} lowcommDataType_t;
/* Values as NCCL's ncclRedOp_t; the bitwise reductions (integers and bool only) are lowcomm's
 * own. Codecs take lowcommSum and lowcommAvg. Integer sums and products wrap; integer averages
 * truncate toward zero; floating-point min and max propagate NaN. */
typedef enum {
  lowcommSum = 0,
  lowcommProd = 1,
  lowcommMax = 2,
  lowcommMin = 3,
  lowcommAvg = 4,
  lowcommBand = 64, /* lowcomm */
  lowcommBor = 65,  /* lowcomm */
  lowcommBxor = 66  /* lowcomm */
} lowcommRedOp_t;

typedef struct {
  char internal[LOWCOMM_UNIQUE_ID_BYTES];
} lowcommUniqueId;

typedef struct lowcommComm* lowcommComm_t;
typedef struct lowcommRequest* lowcommRequest_t;

/* lowcomm: what one operation did on this rank, as lowcomm::OpStats (docs/collectives.md,
 * "Statistics"). Bytes on the wire are payload plus the transport's chunk headers plus the
 * operation's descriptors; times are nanoseconds of the steady clock.
 *
 * Versioned by its size, as NCCL versions ncclConfig_t: the caller sets structSize to
 * sizeof(lowcommOpStats), e.g. `lowcommOpStats s = LOWCOMM_OP_STATS_INIT;`, and the library
 * writes only the fields that lie wholly within structSize bytes, never a byte past them, and
 * never structSize itself. Fields are only ever appended: a program built against an older,
 * shorter lowcommOpStats gets the fields it knows from a newer library; one built against a
 * newer header gets an older library's fields, the rest left as it set them. structSize 0, or
 * below LOWCOMM_OP_STATS_MIN_SIZE, is lowcommInvalidArgument and nothing is written. */
typedef struct {
  size_t structSize; /* set by the caller: sizeof(lowcommOpStats) */
  char kind[16];     /* "all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier",
                        "send", "recv"; "" before any operation */
  char codec[48];    /* the codec spec on the wire ("q4"); "" uncompressed */
  uint64_t sequence;
  uint64_t count;     /* the call's element count */
  uint64_t wallNs;    /* from when it started running to its completion */
  uint64_t bytesSent; /* on the wire, to all peers */
  uint64_t bytesReceived;
  uint64_t payloadBytesSent;      /* bytesSent less chunk headers and descriptors */
  uint64_t uncompressedBytesSent; /* the payload the uncompressed algorithm sends */
  double compressionRatio;        /* uncompressedBytesSent / payloadBytesSent; 1 uncompressed */
  uint64_t encodeNs;              /* in the codec's encodes (0 uncompressed) */
  uint64_t decodeNs;              /* in the codec's decodes (0 uncompressed) */
  uint64_t networkWaitNs;         /* blocked waiting for sends and receives */
  /* Emulated link (LOWCOMM_WAN) only, else 0: the least time the link allows for these bytes
   * (max(sent * 8 / uplink, received * 8 / downlink) + one one-way delay), and that / wall. */
  uint64_t linkLimitNs;
  double linkEfficiency;
  /* Sparse codecs (topk, randk), else 0: the fraction of elements kept, and of payloadBytesSent
   * the bytes of positions (offsets or bitmaps) and of value codes. */
  double density;
  uint64_t indexBytesSent;
  uint64_t valueBytesSent;
  /* CUDA buffers (the *OnStream calls), else 0: bytes copied device to host and host to device
   * for this operation (encoded bytes only where the GPU encodes: docs/collectives.md). */
  uint64_t deviceToHostBytes;
  uint64_t hostToDeviceBytes;
  /* Chunks of this operation's received messages that failed their payload check and were
   * sent again by their sender (docs/transport.md, "Re-sends"). */
  uint64_t chunksResent;
} lowcommOpStats;

/* A lowcommOpStats ready to be filled: structSize set, every field zero. Every field is named
 * so that C and C++ compilers with -Wmissing-field-initializers accept it. */
#define LOWCOMM_OP_STATS_INIT                                                                     \
  {                                                                                               \
    sizeof(lowcommOpStats), {0}, {0}, 0, 0, 0, 0, 0, 0, 0, 0.0, 0, 0, 0, 0, 0.0, 0.0, 0, 0, 0, 0, \
        0                                                                                         \
  }
/* The smallest structSize the library takes: structSize and the first field, kind. */
#define LOWCOMM_OP_STATS_MIN_SIZE (offsetof(lowcommOpStats, codec))

LOWCOMM_API const char* lowcommGetErrorString(lowcommResult_t result);
/* The message of the last failed call on comm (this thread's last failed call when comm is
 * NULL: an init, or a lowcommWait/lowcommTest completing after its comm was destroyed or
 * aborted). Valid until the next call on comm. */
LOWCOMM_API const char* lowcommGetLastError(lowcommComm_t comm);

/* LOWCOMM_VERSION_CODE of the library loaded (as ncclGetVersion); lowcommInvalidArgument when
 * version is NULL. */
LOWCOMM_API lowcommResult_t lowcommGetVersion(int* version);

/* Rank 0's address from LOWCOMM_SOCKET_IFNAME (or the first non-loopback interface). */
LOWCOMM_API lowcommResult_t lowcommGetUniqueId(lowcommUniqueId* uniqueId);
/* lowcomm: with an explicit listen address ("127.0.0.1", "10.0.0.5:29500"). */
LOWCOMM_API lowcommResult_t lowcommGetUniqueIdAt(const char* address, lowcommUniqueId* uniqueId);
/* lowcomm: printable form, for environment variables and files. */
LOWCOMM_API lowcommResult_t lowcommUniqueIdToString(const lowcommUniqueId* uniqueId, char* buf,
                                                    size_t len);
LOWCOMM_API lowcommResult_t lowcommUniqueIdFromString(const char* text, lowcommUniqueId* uniqueId);

/* Options from the environment: LOWCOMM_STREAMS, LOWCOMM_SOCKET_BUFFER, LOWCOMM_WAN,
 * LOWCOMM_TIMEOUT_S, LOWCOMM_SOCKET_IFNAME, LOWCOMM_UNEXPECTED_LIMIT, LOWCOMM_CODEC
 * (all-reduce's codec when the call passes NULL; unset: uncompressed), LOWCOMM_SPARSE_SCHEDULE
 * (a randk codec's all-reduce: gather-all, owner or auto, the default; docs/sparse.md). */
LOWCOMM_API lowcommResult_t lowcommCommInitRank(lowcommComm_t* comm, int nranks,
                                                lowcommUniqueId commId, int rank);
/* Finishes queued operations, then closes (waiting for the peers to do the same). */
LOWCOMM_API lowcommResult_t lowcommCommDestroy(lowcommComm_t comm);
/* Cancels everything in flight, then frees the communicator. */
LOWCOMM_API lowcommResult_t lowcommCommAbort(lowcommComm_t comm);
LOWCOMM_API lowcommResult_t lowcommCommCount(const lowcommComm_t comm, int* count);
LOWCOMM_API lowcommResult_t lowcommCommUserRank(const lowcommComm_t comm, int* rank);
/* lowcommSuccess, or the failure that broke the communicator. */
LOWCOMM_API lowcommResult_t lowcommCommGetAsyncError(lowcommComm_t comm,
                                                     lowcommResult_t* asyncError);

/* codec: a codec spec ("q4", "q2:sr", "minmax4", docs/codecs.md) or NULL for uncompressed.
 * Sparse codecs ("topk:64/4096+q2", "randk:0.02+q2") send every rank's message to every rank and
 * sum them in rank order, or for randk reduce the kept elements by owners
 * (LOWCOMM_SPARSE_SCHEDULE); all-reduce only: reduce-scatter and reduce refuse them. */
LOWCOMM_API lowcommResult_t lowcommAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             lowcommDataType_t datatype, lowcommRedOp_t op,
                                             const char* codec, lowcommComm_t comm,
                                             lowcommRequest_t* request);
/* lowcomm: lowcommAllReduce with error feedback (docs/collectives.md, "Error feedback"): this
 * rank's quantization error is kept under the residual named errorFeedbackKey and added to its
 * next contribution under that key; ownerErrorFeedback nonzero: the owners' re-quantization keeps
 * a residual too. Needs a lossy codec (the call's, or LOWCOMM_CODEC's); a key used for a tensor of
 * another size fails the call. */
LOWCOMM_API lowcommResult_t lowcommAllReduceErrorFeedback(
    const void* sendbuff, void* recvbuff, size_t count, lowcommDataType_t datatype,
    lowcommRedOp_t op, const char* codec, const char* errorFeedbackKey, int ownerErrorFeedback,
    lowcommComm_t comm, lowcommRequest_t* request);
/* lowcomm: drops the residual errorFeedbackKey and every key under it ("layer3" drops
 * "layer3/w", not "layer30"; NULL or "": all), in call order with the operations; *dropped (may
 * be NULL) says how many. The next use of a dropped key starts from a zero residual. */
LOWCOMM_API lowcommResult_t lowcommResetErrorFeedback(lowcommComm_t comm,
                                                      const char* errorFeedbackKey,
                                                      size_t* dropped);
LOWCOMM_API lowcommResult_t lowcommAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             lowcommDataType_t datatype, lowcommComm_t comm,
                                             lowcommRequest_t* request);
/* codec as lowcommAllReduce's: each contribution quantized once, the owner's sum rounded to the
 * datatype in recvbuff. */
LOWCOMM_API lowcommResult_t lowcommReduceScatter(const void* sendbuff, void* recvbuff,
                                                 size_t recvcount, lowcommDataType_t datatype,
                                                 lowcommRedOp_t op, const char* codec,
                                                 lowcommComm_t comm, lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                             lowcommDataType_t datatype, int root,
                                             lowcommComm_t comm, lowcommRequest_t* request);
/* lowcomm: the same operations on CUDA device buffers, with NCCL's argument order: the stream
 * is the last argument before the request (a cudaStream_t; NULL: the legacy default stream).
 * The operation reads its input after the work queued on `stream` before the call, and the
 * call returns once the operation has completed, so the work queued on `stream` after it sees
 * the result. Unlike NCCL, the host waits: lowcomm's collectives run on the host, and a
 * device-side wait released by their completion could deadlock against a thread blocked in a
 * CUDA call on that stream (docs/collectives.md, "CUDA buffers"); call from a thread of its own
 * to overlap. request may be NULL (the call then returns the operation's result); otherwise
 * lowcommWait / lowcommTest / lowcommWaitStats on it as for host buffers. Every rank ends with
 * the same bits as with host buffers, so a group may mix host and device ranks. Compressed
 * dense all-reduce and reduce-scatter encode and decode on the GPU (only encoded bytes cross
 * PCIe); the rest stage through pinned host memory (lowcommOpStats' deviceToHostBytes /
 * hostToDeviceBytes say which). A build without CUDA, or a process without a device:
 * lowcommUnsupported, nothing sent, the communicator usable; a host pointer passed as a device
 * buffer: lowcommInvalidArgument. A failed operation leaves the outputs untouched (one
 * exception: a CUDA error during the GPU-codec path's final decode leaves recvbuff partly
 * written). A call one rank cannot set up (the pinned pool's limit, a device out-of-memory)
 * fails on every rank, naming that rank, and the communicator with it.
 * errorFeedbackKey: NULL or "" for none. */
#ifndef __DRIVER_TYPES_H__ /* CUDA's own declaration (driver_types.h), when not included */
typedef struct CUstream_st* cudaStream_t;
#endif
LOWCOMM_API lowcommResult_t lowcommAllReduceOnStream(const void* sendbuff, void* recvbuff,
                                                     size_t count, lowcommDataType_t datatype,
                                                     lowcommRedOp_t op, const char* codec,
                                                     const char* errorFeedbackKey,
                                                     lowcommComm_t comm, cudaStream_t stream,
                                                     lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommReduceScatterOnStream(const void* sendbuff, void* recvbuff,
                                                         size_t recvcount,
                                                         lowcommDataType_t datatype,
                                                         lowcommRedOp_t op, const char* codec,
                                                         lowcommComm_t comm, cudaStream_t stream,
                                                         lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommAllGatherOnStream(const void* sendbuff, void* recvbuff,
                                                     size_t sendcount, lowcommDataType_t datatype,
                                                     lowcommComm_t comm, cudaStream_t stream,
                                                     lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommBroadcastOnStream(const void* sendbuff, void* recvbuff,
                                                     size_t count, lowcommDataType_t datatype,
                                                     int root, lowcommComm_t comm,
                                                     cudaStream_t stream,
                                                     lowcommRequest_t* request);
/* As ncclReduce: the result on root only (other ranks' recvbuff unused, may be NULL); codec as
 * lowcommAllReduce's. */
LOWCOMM_API lowcommResult_t lowcommReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          lowcommDataType_t datatype, lowcommRedOp_t op, int root,
                                          const char* codec, lowcommComm_t comm,
                                          lowcommRequest_t* request);
/* root's recvbuff holds sendcount * nranks elements, rank r's at r * sendcount. */
LOWCOMM_API lowcommResult_t lowcommGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                          lowcommDataType_t datatype, int root, lowcommComm_t comm,
                                          lowcommRequest_t* request);
/* root's sendbuff holds recvcount * nranks elements; rank r receives the r-th block. */
LOWCOMM_API lowcommResult_t lowcommScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           lowcommDataType_t datatype, int root, lowcommComm_t comm,
                                           lowcommRequest_t* request);
/* As MPI_Alltoallv: arrays of nranks counts and displacements, in elements. */
LOWCOMM_API lowcommResult_t lowcommAllToAllv(const void* sendbuff, const size_t* sendcounts,
                                             const size_t* sdispls, void* recvbuff,
                                             const size_t* recvcounts, const size_t* rdispls,
                                             lowcommDataType_t datatype, lowcommComm_t comm,
                                             lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommSend(const void* sendbuff, size_t count,
                                        lowcommDataType_t datatype, int peer, lowcommComm_t comm,
                                        lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommRecv(void* recvbuff, size_t count, lowcommDataType_t datatype,
                                        int peer, lowcommComm_t comm, lowcommRequest_t* request);
LOWCOMM_API lowcommResult_t lowcommBarrier(lowcommComm_t comm, lowcommRequest_t* request);

/* *done = 1 when complete; the request is then freed and its result returned.
 * lowcommTest and lowcommWait stay valid after lowcommCommDestroy or lowcommCommAbort of the
 * request's communicator (e.g. one thread waits while a watchdog thread aborts): the request
 * returns its result, and a failure's text goes to lowcommGetLastError(NULL) of this thread. */
LOWCOMM_API lowcommResult_t lowcommTest(lowcommRequest_t request, int* done);
/* Waits for completion, frees the request, returns its result. */
LOWCOMM_API lowcommResult_t lowcommWait(lowcommRequest_t request);
/* lowcomm: lowcommWait that also fills *stats with the operation's statistics (a failed
 * operation's too: what it issued before failing), the fields within stats->structSize. NULL
 * request or stats, or a structSize refused (lowcommOpStats): lowcommInvalidArgument, and the
 * request is neither waited for nor freed. */
LOWCOMM_API lowcommResult_t lowcommWaitStats(lowcommRequest_t request, lowcommOpStats* stats);
/* lowcomm: the statistics of the operation comm completed last (collective or point-to-point,
 * succeeded or failed; not a call refused for its arguments); all zero before the first. The
 * fields within stats->structSize are written (lowcommOpStats). */
LOWCOMM_API lowcommResult_t lowcommCommGetLastOpStats(lowcommComm_t comm, lowcommOpStats* stats);

/* ---- lowcomm: elastic communicators (docs/membership.md) ----
 * A group whose members may die, freeze, leave and join between collectives; each collective
 * commits on every live member or fails with its inputs untouched (lowcommAborted: a member
 * failed; the group formed a new view of the survivors; call again), or, for a member cut off
 * from the group for good, lowcommFenced on this and every later call (do not call again:
 * rejoin as a new member). Named after NCCL's
 * ncclCommInitRankScalable / ncclCommShrink family; blocking calls, one calling thread. */
typedef struct lowcommElasticComm* lowcommElasticComm_t;

/* Versioned by its size, as lowcommOpStats: set structSize (LOWCOMM_ELASTIC_CONFIG_INIT);
 * zero fields take the defaults. */
typedef struct {
  size_t structSize;
  int retries;             /* collectives re-run by the library in the next view (default 0) */
  int heartbeatMs;         /* heartbeat interval (default 100) */
  int failureTimeoutMs;    /* least silence before a member is failed (LOWCOMM_FAILURE_TIMEOUT_MS,
                              default 1500; grows with the measured heartbeat RTT) */
  int viewChangeTimeoutMs; /* how long a call waits for a new view (default 30000) */
} lowcommElasticConfig_t;
#define LOWCOMM_ELASTIC_CONFIG_INIT \
  { sizeof(lowcommElasticConfig_t), 0, 0, 0, 0 }

/* The founding members: every rank of [0, nranks) calls it with the same id; member id = rank.
 * config may be NULL. */
LOWCOMM_API lowcommResult_t lowcommElasticCommInitRank(lowcommElasticComm_t* comm, int nranks,
                                                       lowcommUniqueId commId, int rank,
                                                       const lowcommElasticConfig_t* config);
/* A new member: enters through any live member listed in seeds (their
 * lowcommElasticCommMemberAddress), authenticated with the group's id; returns once admitted
 * (the group admits joiners when it commits its next collective). */
LOWCOMM_API lowcommResult_t lowcommElasticCommJoin(lowcommElasticComm_t* comm,
                                                   lowcommUniqueId commId, const char* const* seeds,
                                                   int nseeds,
                                                   const lowcommElasticConfig_t* config);
/* Leaves the group (the others form a view without this member at once) and frees comm. */
LOWCOMM_API lowcommResult_t lowcommElasticCommDestroy(lowcommElasticComm_t comm);
/* The current view: its id and its members' ids, ascending (a member's rank is its position);
 * members may be NULL to ask only for the count (*nmembers). capacity: entries in members.
 * While the member is not lowcommElasticLive (lowcommElasticCommState) this is the last view it
 * knew, and some of its members may be gone. */
LOWCOMM_API lowcommResult_t lowcommElasticCommView(lowcommElasticComm_t comm, uint64_t* viewId,
                                                   int* members, int capacity, int* nmembers);
/* Where this member stands: in its view; between views (a change in progress: calls wait for the
 * next one); or out of the group for good, evicted, without a quorum or left (every call then
 * returns lowcommFenced at once, naming why in lowcommElasticGetLastError: rejoin). */
typedef enum {
  lowcommElasticLive = 0,
  lowcommElasticChanging = 1,
  lowcommElasticFenced = 2
} lowcommElasticState_t;
LOWCOMM_API lowcommResult_t lowcommElasticCommState(lowcommElasticComm_t comm,
                                                    lowcommElasticState_t* state);
LOWCOMM_API lowcommResult_t lowcommElasticCommUserRank(lowcommElasticComm_t comm, int* rank);
LOWCOMM_API lowcommResult_t lowcommElasticCommCount(lowcommElasticComm_t comm, int* count);
LOWCOMM_API lowcommResult_t lowcommElasticCommMemberId(lowcommElasticComm_t comm, int* memberId);
/* Where joiners reach this member ("host:port"), NUL-terminated within len bytes. */
LOWCOMM_API lowcommResult_t lowcommElasticCommMemberAddress(lowcommElasticComm_t comm, char* buf,
                                                            size_t len);
/* Named state every replica holds alike (hashed at every commit; fetched by joiners). */
LOWCOMM_API lowcommResult_t lowcommElasticRegisterState(lowcommElasticComm_t comm, const char* name,
                                                        void* data, size_t bytes);
/* Blocking all-reduce in the current view; codec and errorFeedbackKey may be NULL. */
LOWCOMM_API lowcommResult_t lowcommElasticAllReduce(const void* sendbuff, void* recvbuff,
                                                    size_t count, lowcommDataType_t datatype,
                                                    lowcommRedOp_t op, const char* codec,
                                                    const char* errorFeedbackKey,
                                                    lowcommElasticComm_t comm);
/* Blocking broadcast of member rootMemberId's sendbuff (a member id, not a rank) into every
 * member's recvbuff; recvbuff is untouched on every member but the root when the call aborts
 * (lowcommAborted, also when the root is no longer in the view). */
LOWCOMM_API lowcommResult_t lowcommElasticBroadcast(const void* sendbuff, void* recvbuff,
                                                    size_t count, lowcommDataType_t datatype,
                                                    int rootMemberId, lowcommElasticComm_t comm);
/* Blocking all-gather: block i of recvbuff (sendcount elements) comes from the i-th member of
 * the view the call committed in, returned in *viewId and members[0..*nmembers) (all three may
 * be NULL; capacity: entries in members). recvbuff holds sendcount * the view's size as of the
 * call; sendbuff and recvbuff must not overlap. */
LOWCOMM_API lowcommResult_t lowcommElasticAllGather(const void* sendbuff, void* recvbuff,
                                                    size_t sendcount, lowcommDataType_t datatype,
                                                    lowcommElasticComm_t comm, uint64_t* viewId,
                                                    int* members, int capacity, int* nmembers);
/* The text of this comm's last failed call (NULL: this thread's last failed init or join). */
LOWCOMM_API const char* lowcommElasticGetLastError(lowcommElasticComm_t comm);

#ifdef __cplusplus
}
#endif

#endif /* LOWCOMM_LOWCOMM_H_ */
