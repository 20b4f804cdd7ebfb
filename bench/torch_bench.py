#!/usr/bin/env python3
"""All-reduce through torch.distributed: lowcomm (uncompressed and with codecs) against Gloo,
in the same processes, over the same links (docs/torch.md).

    .venv/bin/python bench/torch_bench.py -n 4 --netns lc -b 1M -e 256M --codecs none,q8,q4
    .venv/bin/python bench/torch_bench.py -n 4 -b 1M -e 16M          # loopback, no namespaces

The launcher starts P ranks (under --netns PREFIX as `ip netns exec PREFIX<k>`, addresses from
scripts/wan_netns.sh's /run/lowcomm-wan/PREFIX.conf). Every rank joins a default Gloo group and
one lowcomm group per codec (pg_options=lowcomm.torch.Options(codec=..., codec_threshold=0)).
Per size and library: -w untimed calls, then -i calls each after a barrier of the group being
timed (as lowcomm-bench does: ranks leave a barrier of their own group together); a call's time
is the slowest rank's (MAX over Gloo of every rank's times, after the timed calls); the row is
the median: the statistic of lowcomm-bench's rows, with the p50 and p99 of the same per-call
times. --back-to-back drops the per-call barrier. Both libraries are timed the same way in the
same processes, alternating per size. Rank 0 prints a table, writes --csv (lowcomm-bench's
columns where they apply) and --plot (a PNG through bench/plot_bench.py, which needs Debian's
python3-matplotlib).

Against the C++ API, back to back in one run (docs/torch.md, "Small ops"):

    .venv/bin/python bench/torch_bench.py -n 2 -b 4K -e 4K -w 200 -i 3000 --codecs none \
        --back-to-back --vs-api build/bin/lowcomm-bench --repeat 3

runs, --repeat times in turn, this benchmark and then lowcomm-bench with the same ranks, sizes,
calls and timing (uncompressed, --back-to-back as given), and prints per size the p50 and p99 of
both and what torch.distributed adds.
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def sizes(lo, hi, factor):
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def pct(sorted_times, q):
    """The nearest-rank q-quantile (as lowcomm-bench --back-to-back prints it)."""
    k = min(len(sorted_times), max(1, math.ceil(q * len(sorted_times))))
    return sorted_times[k - 1]


def worker(a):
    import torch
    import torch.distributed as dist

    import lowcomm.torch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://{a.addr}:{a.port}", rank=a.rank,
                            world_size=a.ranks)
    groups = {"gloo": None}
    for codec in a.codecs.split(","):
        opts = lowcomm.torch.Options(codec="" if codec == "none" else codec, codec_threshold=0)
        groups[f"lowcomm-{codec}"] = dist.new_group(backend="lowcomm", pg_options=opts)
    rows = []
    for size in sizes(parse_size(a.b), parse_size(a.e), a.f):
        n = size // 4
        x = torch.randn(n, generator=torch.Generator().manual_seed(a.rank))
        for name, group in groups.items():
            times = []
            if a.back_to_back:
                dist.barrier(group=group)
            for it in range(a.w + a.i):
                t = x.clone()
                if not a.back_to_back:
                    dist.barrier(group=group)
                t0 = time.perf_counter()
                dist.all_reduce(t, group=group)
                if it >= a.w:
                    times.append(time.perf_counter() - t0)
            # per call, the slowest rank (gathered after the timed calls, as lowcomm-bench does)
            slowest = torch.tensor(times, dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            per_call = sorted(slowest.tolist())
            rows.append((name, size, statistics.median(per_call), pct(per_call, 0.5),
                         pct(per_call, 0.99)))
    if a.rank == 0:
        gloo = {s: t for (nm, s, t, _, _) in rows if nm == "gloo"}
        print(f"# torch {torch.__version__}, {a.ranks} ranks, fp32 sum, medians of {a.i} calls"
              f"{', netns ' + a.netns if a.netns else ', loopback'}"
              f"{', back to back' if a.back_to_back else ''}")
        print(f"{'library':<16}{'bytes':>12}{'time(s)':>12}{'vs gloo':>9}{'p50(us)':>10}"
              f"{'p99(us)':>10}")
        for nm, s, t, p50, p99 in rows:
            print(f"{nm:<16}{s:>12}{t:>12.6f}{gloo[s] / t:>8.2f}x{p50 * 1e6:>10.1f}"
                  f"{p99 * 1e6:>10.1f}")
        if a.result:
            with open(a.result, "w") as f:
                json.dump([{"library": nm, "bytes": s, "median_s": t, "p50_s": p50, "p99_s": p99}
                           for nm, s, t, p50, p99 in rows], f)
        out = a.csv or (a.plot + ".csv" if a.plot else "")
        if out:
            link = f"tbf netns {a.netns}" if a.netns else "loopback"
            with open(out, "w", newline="") as f:
                w = csv.writer(f)
                w.writerow(["library", "codec", "collective", "ranks", "bytes", "time_s",
                            "limit_s", "link", "speedup_vs_gloo"])
                for nm, s, t, _, _ in rows:
                    lib, _, codec = nm.partition("-")
                    w.writerow([lib, codec or "none", "all_reduce via torch.distributed",
                                a.ranks, s, f"{t:.6f}", "", link, f"{gloo[s] / t:.4f}"])
        if a.plot:
            plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot_bench.py")
            if subprocess.call(["/usr/bin/python3", plot, out, a.plot]) != 0:
                print(f"torch_bench: plotting {a.plot} failed", file=sys.stderr)
    dist.destroy_process_group()


def launch(a):
    if not a.vs_api:
        return launch_torch(a, sys.argv[1:])
    # torch.distributed and lowcomm-bench in turn, --repeat times, then what torch adds.
    api_args = [a.vs_api, "-n", str(a.ranks), "-b", a.b, "-e", a.e, "-f", str(a.f),
                "-w", str(a.w), "-i", str(a.i), "--codec", "none"]
    if a.back_to_back:
        api_args.append("--back-to-back")
    if a.netns:
        api_args += ["--netns", a.netns]
    line = re.compile(r"^\s+(\d+)\s+\d+\s+([0-9.]+)\s")
    tail = re.compile(r"p50 ([0-9.]+) us, p99 ([0-9.]+) us")
    summary = []
    for rep in range(a.repeat):
        result = f"/tmp/torch_bench.{os.getpid()}.{rep}.json"
        argv = [x for x in sys.argv[1:]]
        rc = launch_torch(a, argv + ["--result", result])
        if rc != 0:
            return rc
        with open(result) as f:
            torch_rows = {r["bytes"]: r for r in json.load(f) if r["library"] == "lowcomm-none"}
        os.unlink(result)
        print("# " + " ".join(api_args), flush=True)
        out = subprocess.run(api_args, capture_output=True, text=True, timeout=a.timeout)
        sys.stdout.write(out.stdout)
        if out.returncode != 0:
            sys.stderr.write(out.stderr)
            return out.returncode
        size = None
        for l in out.stdout.splitlines():
            m = line.match(l)
            if m:
                size = int(m.group(1))
                continue
            m = tail.search(l)
            if m and size in torch_rows:
                t = torch_rows[size]
                summary.append((rep, size, t["p50_s"] * 1e6, t["p99_s"] * 1e6,
                                float(m.group(1)), float(m.group(2))))
    print(f"# all-reduce, {a.ranks} ranks, {a.i} calls per size"
          f"{', back to back' if a.back_to_back else ', barrier before each call'}: "
          "torch.distributed (lowcomm, uncompressed) against lowcomm-bench (C++ API), in turn")
    print(f"{'run':>4}{'bytes':>10}{'torch p50':>11}{'API p50':>9}{'added':>8}"
          f"{'torch p99':>11}{'API p99':>9}{'added':>8}   (us)")
    for rep, size, tp50, tp99, cp50, cp99 in summary:
        print(f"{rep + 1:>4}{size:>10}{tp50:>11.1f}{cp50:>9.1f}{tp50 - cp50:>8.1f}"
              f"{tp99:>11.1f}{cp99:>9.1f}{tp99 - cp99:>8.1f}")
    return 0


def launch_torch(a, argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", LOWCOMM_DEBUG="NONE")
    addr = "127.0.0.1"
    if a.netns:
        conf = open(f"/run/lowcomm-wan/{a.netns}.conf").read()
        subnet = [l.split("=", 1)[1] for l in conf.splitlines() if l.startswith("SUBNET=")][0]
        addr = f"{subnet}.1"
        env.update(GLOO_SOCKET_IFNAME=f"{a.netns}eth0", LOWCOMM_SOCKET_IFNAME=f"={a.netns}eth0")
    else:
        env.update(GLOO_SOCKET_IFNAME="lo", LOWCOMM_SOCKET_IFNAME="=lo")
    procs = []
    for r in range(a.ranks):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--rank", str(r),
               "--addr", addr] + argv
        if a.netns:
            cmd = ["ip", "netns", "exec", f"{a.netns}{r}"] + cmd
        procs.append(subprocess.Popen(cmd, env=env))
    rc = 0
    for p in procs:
        rc |= p.wait(timeout=a.timeout)
    return rc


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--ranks", type=int, default=4)
    p.add_argument("-b", default="1M")
    p.add_argument("-e", default="16M")
    p.add_argument("-f", type=int, default=4)
    p.add_argument("-w", type=int, default=1)
    p.add_argument("-i", type=int, default=3)
    p.add_argument("--codecs", default="none,q8,q4")
    p.add_argument("--netns", default="")
    p.add_argument("--csv", default="")
    p.add_argument("--back-to-back", action="store_true",
                   help="no barrier before each timed call (as lowcomm-bench --back-to-back)")
    p.add_argument("--plot", default="", help="PNG of time against size (/usr/bin/python3 with "
                   "matplotlib); the CSV goes to --csv or PLOT.csv")
    p.add_argument("--vs-api", default="", metavar="LOWCOMM_BENCH",
                   help="also run this lowcomm-bench binary with the same ranks, sizes and "
                   "calls (uncompressed), in turn with this benchmark, and print the p50 and p99 "
                   "torch.distributed adds")
    p.add_argument("--repeat", type=int, default=1, help="with --vs-api: runs of each, in turn")
    p.add_argument("--result", default="", help=argparse.SUPPRESS)  # rank 0's rows, as JSON
    p.add_argument("--port", type=int, default=29561)
    p.add_argument("--timeout", type=int, default=1800)
    p.add_argument("--worker", action="store_true")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--addr", default="127.0.0.1")
    a = p.parse_args()
    if a.worker:
        worker(a)
        return 0
    return launch(a)


if __name__ == "__main__":
    sys.exit(main())
