"""How long torchft's process group takes to rebuild, lowcomm's against Gloo's (docs/torch.md).

torchft rebuilds its process group at every quorum change (ProcessGroupWrapper.configure over a
fresh store prefix), so a group's set-up is on the critical path of every recovery. Each of P
processes rebuilds the group R times, as torchft does (same processes, a new prefix each time),
starting together (a store barrier); a rebuild's time is configure -> its first all-reduce of
one element done, on the slowest rank. The store connection torchft opens in each configure is
one client per process here, reused under the new prefix: a fresh TCPStore client stalled 5 s
about once every 25 connections on the development host, for Gloo and lowcomm alike, which
would measure the store, not the group. Also reported: the open file descriptors, threads and
resident memory of a rank before the first and after the last rebuild (leaks).

    .venv/bin/python bench/torchft_pg_rebuild.py --ranks 2,4,8 --rebuilds 30
"""
import argparse
import os
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def usage():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    with open("/proc/self/statm") as f:
        rss_mib = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    return fds, threads, rss_mib


def make_pg(kind):
    if kind == "lowcomm":
        from lowcomm.torchft import ProcessGroupLowcomm
        return ProcessGroupLowcomm(timeout=timedelta(seconds=30))
    from torchft.process_group import ProcessGroupGloo
    return ProcessGroupGloo(timeout=timedelta(seconds=30))


def worker(rank, world, port, kind, rebuilds, results):
    import torchft.process_group as tpg
    store = dist.TCPStore("127.0.0.1", port, world, False, timeout=timedelta(seconds=60))
    # configure's "host:port/prefix": the prefix over this process's one client (module doc).
    tpg.create_store_client = lambda addr, timeout: dist.PrefixStore(addr.split("/", 1)[1], store)
    pg = make_pg(kind)
    times = []
    before = None
    for k in range(rebuilds + 1):  # the first rebuild is a warm-up (imports, first threads)
        store.add(f"{kind}/{world}/ready{k}", 1)
        while int(store.add(f"{kind}/{world}/ready{k}", 0)) < world:
            time.sleep(0.0005)
        if k == 1:
            before = usage()
        t0 = time.monotonic()
        pg.configure(f"127.0.0.1:{port}/{kind}/{world}/{k}", "bench", rank, world)
        x = torch.zeros(1)
        pg.allreduce([x], dist.ReduceOp.SUM).wait()
        if k:
            times.append(time.monotonic() - t0)
    after = usage()
    pg.shutdown()
    results.put((rank, times, before, after))


def run(kind, world, rebuilds):
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=timedelta(seconds=60),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, store.port, kind, rebuilds, results))
             for r in range(world)]
    for p in procs:
        p.start()
    out = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    slowest = [max(o[1][k] for o in out) for k in range(rebuilds)]
    rank0 = next(o for o in out if o[0] == 0)
    return slowest, rank0[2], rank0[3]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--rebuilds", type=int, default=30)
    ap.add_argument("--pg", default="lowcomm,gloo")
    a = ap.parse_args()
    print(f"# torchft process-group rebuilds: configure -> first all-reduce done, slowest rank; "
          f"{a.rebuilds} rebuilds (after one warm-up); torch {torch.__version__}")
    print(f"{'pg':>8} {'ranks':>5} {'p50_ms':>8} {'p90_ms':>8} {'max_ms':>8}  "
          f"rank 0 before -> after {a.rebuilds} rebuilds (fds, threads, RSS MiB)")
    for world in [int(w) for w in a.ranks.split(",")]:
        for kind in a.pg.split(","):
            t, before, after = run(kind, world, a.rebuilds)
            t = sorted(t)
            print(f"{kind:>8} {world:>5} {1e3 * statistics.median(t):8.1f} "
                  f"{1e3 * t[int(0.9 * (len(t) - 1))]:8.1f} {1e3 * t[-1]:8.1f}  "
                  f"{before[0]}, {before[1]}, {before[2]:.0f} -> {after[0]}, {after[1]}, "
                  f"{after[2]:.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
