"""torchft under faults, lowcomm's process group against Gloo's (docs/torch.md, "torchft").

Three replicas (processes) run torchft's Manager (synchronous quorum, min_replica_size 2) over a
Lighthouse in this process: each step starts a quorum, works `--inner-ms`, all-reduces a 4 MiB
fp32 gradient and commits if the Manager says so. One replica is then frozen (SIGSTOP for
`--freeze-s`, then SIGCONT) or killed (SIGKILL); the figure is the time from the fault to the
survivors' next commit (the later of the two), and how many commits each side made in the
window. The Lighthouse's heartbeat timeout (`--heartbeat-ms`) is the same for both groups.

    .venv/bin/python bench/torchft_faults.py --pg lowcomm,gloo --fault stop --trials 3
"""
import argparse
import os
import signal
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def replica(idx, kind, lighthouse, inner_s, commits, stop):
    from torchft import Manager
    if kind == "lowcomm":
        from lowcomm.torchft import ProcessGroupLowcomm
        pg = ProcessGroupLowcomm(timeout=timedelta(seconds=60))
    else:
        from torchft.process_group import ProcessGroupGloo
        pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
    store = dist.TCPStore("localhost", 0, 1, True, wait_for_workers=False)
    w = torch.zeros(1 << 20)
    manager = Manager(pg=pg, min_replica_size=2, use_async_quorum=False,
                      load_state_dict=lambda sd: w.copy_(sd["w"]),
                      state_dict=lambda: {"w": w}, replica_id=f"replica{idx}",
                      store_addr="localhost", store_port=store.port, rank=0, world_size=1,
                      lighthouse_addr=lighthouse, timeout=timedelta(seconds=60),
                      quorum_timeout=timedelta(seconds=60))
    while not stop.is_set():
        manager.start_quorum()
        time.sleep(inner_s)
        g = torch.ones(1 << 20)
        try:
            manager.allreduce(g).wait()
        except Exception:  # noqa: BLE001  (torchft reports it through should_commit)
            pass
        if manager.should_commit():
            w.add_(g)
            commits.put((idx, time.monotonic(), manager.num_participants()))
    manager.shutdown(wait=False)


def trial(kind, fault, freeze_s, inner_s, heartbeat_ms, seed):
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2, join_timeout_ms=100,
                                  heartbeat_timeout_ms=heartbeat_ms)
    ctx = mp.get_context("spawn")
    commits, stop = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=replica, args=(i, kind, lighthouse.address(), inner_s, commits,
                                               stop), daemon=True) for i in range(3)]
    for p in procs:
        p.start()
    seen = []

    def drain(until):
        while time.monotonic() < until:
            try:
                seen.append(commits.get(timeout=max(0.01, until - time.monotonic())))
            except Exception:  # noqa: BLE001  (queue.Empty)
                pass

    # Warm: every replica has committed a few steps.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and min(
            [sum(1 for s in seen if s[0] == i) for i in range(3)]) < 5:
        drain(time.monotonic() + 0.1)
    victim = 2
    drain(time.monotonic() + (seed % 7) * inner_s / 7)  # somewhere in a step
    t_fault = time.monotonic()
    print(f"# {kind}: fault {fault} of replica {victim} at "
          f"{time.strftime('%H:%M:%S', time.localtime())}.{int(time.time() * 1000) % 1000:03d}",
          file=sys.stderr, flush=True)
    os.kill(procs[victim].pid, signal.SIGSTOP if fault == "stop" else signal.SIGKILL)
    drain(t_fault + (freeze_s if fault == "stop" else 10))
    if fault == "stop":
        os.kill(procs[victim].pid, signal.SIGCONT)
        drain(time.monotonic() + 5)
    stop.set()
    drain(time.monotonic() + 2)
    for p in procs:
        p.kill()
        p.join()
    lighthouse.shutdown()
    # Recovered: each survivor has committed a step of a quorum without the victim.
    after = {i: [t for (j, t, n) in seen if j == i and t > t_fault] for i in range(3)}
    without = {i: [t for (j, t, n) in seen if j == i and t > t_fault and n == 2]
               for i in range(3)}
    survivors = [i for i in range(3) if i != victim]
    if not all(without[i] for i in survivors):
        return None, 0
    gap = max(without[i][0] for i in survivors) - t_fault
    window = freeze_s if fault == "stop" else 10.0
    done = min(sum(1 for t in after[i] if t < t_fault + window) for i in survivors)
    return gap, done


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="lowcomm,gloo")
    ap.add_argument("--fault", default="stop", choices=["stop", "kill"])
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--freeze-s", type=float, default=20.0)
    ap.add_argument("--inner-ms", type=int, default=200)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--first-trial", type=int, default=0, help="seed of the first trial")
    a = ap.parse_args()
    print(f"# torchft, 3 replicas, fault {a.fault}"
          + (f" for {a.freeze_s:.0f} s" if a.fault == "stop" else "")
          + f", {a.inner_ms} ms inner work per step, Lighthouse heartbeat timeout "
          f"{a.heartbeat_ms} ms; torch {torch.__version__}")
    for kind in a.pg.split(","):
        gaps, steps = [], []
        for t in range(a.first_trial, a.first_trial + a.trials):
            gap, done = trial(kind, a.fault, a.freeze_s, a.inner_ms / 1e3, a.heartbeat_ms, t)
            print(f"{kind:>8} trial {t}: fault -> survivors' next commit "
                  + ("never" if gap is None else f"{gap:.2f} s")
                  + f", survivors' commits in the window {done}", flush=True)
            if gap is not None:
                gaps.append(gap)
                steps.append(done)
        if gaps:
            print(f"{kind:>8}: median {statistics.median(gaps):.2f} s, max {max(gaps):.2f} s; "
                  f"commits in the window median {statistics.median(steps)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
