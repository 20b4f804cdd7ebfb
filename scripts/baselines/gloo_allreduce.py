"""Gloo baseline for lowcomm's all-reduce: torch.distributed (backend "gloo") all_reduce of an
fp32 tensor over a size sweep, one process per rank. Launched per network namespace by
gloo_allreduce.sh; runs anywhere torch.distributed does:

  .venv/bin/python gloo_allreduce.py --rank R --world-size P --master-addr A [--master-port 29500]
      [-b 1M] [-e 256M] [-f 4] [-w 1] [-n 3]

Timing matches bench/mpi_allreduce_baseline.cc: per size, `warmup` untimed calls, then `iters`
calls each started after a barrier and timed alone; reported is, as lowcomm-bench reports its
own rows, the median over the calls of the slowest rank's time in each call. The
all-reduce is in place, so the input is restored (untimed) before each call. Inputs are small
integers, so the sum is exact and every element is checked on every rank.

Rank 0 prints CSV rows: library,ranks,bytes,seconds,algbw_gbit_s,busbw_gbit_s (Gbit/s).
Gloo picks its interface from GLOO_SOCKET_IFNAME (the launcher sets the namespace's veth).
"""

import argparse
import datetime
import sys
import time

import torch
import torch.distributed as dist


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def run_size(args, rank, world, nbytes):
    count = nbytes // 4
    nbytes = count * 4
    pattern = (torch.arange(count, dtype=torch.int64) % 7 + 1).to(torch.float32)
    source = pattern * float(rank + 1)
    expected = pattern * float(world * (world + 1) // 2)
    del pattern
    work = source.clone()

    for _ in range(args.warmup):
        work.copy_(source)
        dist.all_reduce(work)
    times = torch.zeros(args.iters, dtype=torch.float64)
    for i in range(args.iters):
        work.copy_(source)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(work)
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # per call: the slowest rank
    mine = times.median()  # torch's median of an even count is the lower middle: take both
    if args.iters % 2 == 0:
        mine = times.sort().values[args.iters // 2 - 1:args.iters // 2 + 1].mean()

    wrong = (work != expected).nonzero()
    bad = torch.tensor([wrong.numel()], dtype=torch.int64)
    if wrong.numel():
        i = int(wrong[0])
        print(f"gloo_allreduce: rank {rank}: {wrong.numel()} of {count} elements wrong at "
              f"{nbytes} bytes; first at {i}: got {work[i].item()}, expected {expected[i].item()}",
              file=sys.stderr)
    dist.all_reduce(bad)
    if bad.item():
        return False
    if rank == 0:
        seconds = mine.item()
        algbw = nbytes * 8 / seconds / 1e9
        busbw = algbw * 2 * (world - 1) / world
        print(f"gloo,{world},{nbytes},{seconds:.6f},{algbw:.4f},{busbw:.4f}", flush=True)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--master-addr", required=True)
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("-b", default="1M")
    p.add_argument("-e", default="256M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-w", "--warmup", type=int, default=1)
    p.add_argument("-n", "--iters", type=int, default=3)
    p.add_argument("--timeout-s", type=int, default=600)
    p.add_argument("--no-header", action="store_true")
    args = p.parse_args()
    lo, hi = parse_size(args.b), parse_size(args.e)
    if not (4 <= lo <= hi) or args.f < 2 or args.iters < 1:
        p.error("need 4 <= -b <= -e, -f >= 2, -n >= 1")

    # The reduction is memory-bound and runs on Gloo's own threads; intra-op threads of four
    # ranks on two cores would only contend.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master_addr}:{args.master_port}",
        rank=args.rank, world_size=args.world_size,
        timeout=datetime.timedelta(seconds=args.timeout_s))
    if args.rank == 0 and not args.no_header:
        print("library,ranks,bytes,seconds,algbw_gbit_s,busbw_gbit_s", flush=True)
    ok = True
    size = lo
    while size <= hi:
        if not run_size(args, args.rank, args.world_size, size):
            ok = False
            break
        size *= args.f
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
