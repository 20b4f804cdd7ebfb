"""How long torchft's process group takes to rebuild, lowcomm's against Gloo's (docs/torch.md).

torchft rebuilds its process group at every quorum change (ProcessGroupWrapper.configure over a
fresh store prefix), so a group's set-up is on the critical path of every recovery. Each of P
processes rebuilds the group R times, as torchft does (same processes, a new prefix each time),
starting together (a store barrier); a rebuild's time is configure -> its first all-reduce of
one element done, on the slowest rank. Rank 0 hosts the store, as torchft's replica 0 hosts the
one its groups rendezvous through, so over --netns every other rank reaches it across the
emulated link. The store connection torchft opens in each configure is one client per process
here, reused under the new prefix: a fresh TCPStore client stalled 5 s about once every 25
connections on the development host, for Gloo and lowcomm alike, which would measure the store,
not the group. Also reported: the open file descriptors, threads and resident memory of a rank
before the first and after the last rebuild (leaks).

    .venv/bin/python bench/torchft_pg_rebuild.py --ranks 2,4,8 --rebuilds 30
    scripts/wan_netns.sh up 8 --rate 1gbit --delay 25ms      # RTT 50 ms between any two ranks
    .venv/bin/python bench/torchft_pg_rebuild.py --netns lc --ranks 2,4,8 --rebuilds 10
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta


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


def worker(a):
    import torch
    import torch.distributed as dist
    import torchft.process_group as tpg
    rank, world = a.worker, a.world
    store = dist.TCPStore(a.store_host, a.port, world, rank == 0,
                          timeout=timedelta(seconds=60))
    # configure's "host:port/prefix": the prefix over this process's one client (module doc).
    tpg.create_store_client = lambda addr, timeout: dist.PrefixStore(addr.split("/", 1)[1], store)
    pg = make_pg(a.kind)
    times = []
    before = None
    for k in range(a.rebuilds + 1):  # the first rebuild is a warm-up (imports, first threads)
        # Start together: the last rank to arrive releases everyone through the store, and each
        # rank starts its clock when it sees the release (the store's host first, the far ranks
        # half a round trip later; the figure is the slowest rank's). The releasing rank waits
        # to see it too: TCPStore's set is not answered, so it would start half a round trip
        # early.
        if int(store.add(f"ready{k}", 1)) == world:
            store.set(f"go{k}", "1")
        store.wait([f"go{k}"])
        if k == 1:
            before = usage()
        t0 = time.monotonic()
        pg.configure(f"{a.store_host}:{a.port}/{a.kind}/{world}/{k}", "bench", rank, world)
        x = torch.zeros(1)
        pg.allreduce([x], dist.ReduceOp.SUM).wait()
        if k:
            times.append(time.monotonic() - t0)
    after = usage()
    pg.shutdown()
    print(json.dumps({"rank": rank, "times": times, "before": before, "after": after}),
          flush=True)
    # Rank 0 hosts the store: it leaves last.
    store.add("done", 1)
    if rank == 0:
        while int(store.add("done", 0)) < world:
            time.sleep(0.01)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(a, kind, world):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if a.netns:
        conf = dict(line.split("=", 1) for line in open(f"/run/lowcomm-wan/{a.netns}.conf")
                    .read().splitlines() if "=" in line)
        if int(conf["N"]) < world:
            sys.exit(f"--netns {a.netns} has {conf['N']} namespaces; {world} ranks need more")
        host, port = f"{conf['SUBNET']}.1", 29400 + world
        env.update(GLOO_SOCKET_IFNAME=f"{a.netns}eth0", LOWCOMM_SOCKET_IFNAME=f"={a.netns}eth0")
    else:
        host, port = "127.0.0.1", free_port()
        env.update(GLOO_SOCKET_IFNAME="lo", LOWCOMM_SOCKET_IFNAME="=lo")
    procs = []
    for r in range(world):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(r), "--world",
               str(world), "--kind", kind, "--store-host", host, "--port", str(port),
               "--rebuilds", str(a.rebuilds)]
        if a.netns:
            cmd = ["ip", "netns", "exec", f"{a.netns}{r}"] + cmd
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        text, _ = p.communicate(timeout=600)
        lines = [ln for ln in text.splitlines() if ln.startswith("{")]
        if p.returncode != 0 or not lines:
            sys.exit(f"{kind} with {world} ranks: a rank failed (exit {p.returncode})")
        out.append(json.loads(lines[-1]))
    slowest = [max(o["times"][k] for o in out) for k in range(a.rebuilds)]
    rank0 = next(o for o in out if o["rank"] == 0)
    return slowest, rank0["before"], rank0["after"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--rebuilds", type=int, default=30)
    ap.add_argument("--pg", default="lowcomm,gloo")
    ap.add_argument("--netns", default="",
                    help="namespace prefix of scripts/wan_netns.sh: rank k runs in namespace k")
    ap.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="", help=argparse.SUPPRESS)
    ap.add_argument("--store-host", default="", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker >= 0:
        return worker(a)
    import torch
    where = f"namespaces {a.netns}*" if a.netns else "loopback"
    print(f"# torchft process-group rebuilds: configure -> first all-reduce done, slowest rank; "
          f"{a.rebuilds} rebuilds (after one warm-up); {where}; torch {torch.__version__}")
    print(f"{'pg':>8} {'ranks':>5} {'p50_ms':>8} {'p90_ms':>8} {'max_ms':>8}  "
          f"rank 0 before -> after {a.rebuilds} rebuilds (fds, threads, RSS MiB)")
    for world in [int(w) for w in a.ranks.split(",")]:
        for kind in a.pg.split(","):
            t, before, after = run(a, kind, world)
            t = sorted(t)
            print(f"{kind:>8} {world:>5} {1e3 * statistics.median(t):8.1f} "
                  f"{1e3 * t[int(0.9 * (len(t) - 1))]:8.1f} {1e3 * t[-1]:8.1f}  "
                  f"{before[0]}, {before[1]}, {before[2]:.0f} -> {after[0]}, {after[1]}, "
                  f"{after[2]:.0f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
