"""torchft's failure matrix, lowcomm's process group against Gloo's (docs/torch.md, "torchft").

Three replicas (processes) train one small MLP with torchft's Lighthouse, Manager (synchronous
quorum, min_replica_size 2) and DiLoCo (H inner AdamW steps of `--inner-ms` each, then the
outer step: quorum, pseudo-gradient all-reduces through the process group, should_commit,
outer Nesterov SGD); or, with `--loop manager`, without DiLoCo: each step a quorum,
`--inner-ms` of work and a 4 MiB all-reduce committed through the Manager. Replica 2 is then frozen (SIGSTOP for `--freeze-s`, then SIGCONT), killed
(SIGKILL), or killed and restarted 3 s later; at a random moment, or at a fixed point it reaches
itself: `inner` (among its inner steps), `quorum` (entering the outer step's quorum) or
`allreduce` (its pseudo-gradient all-reduces issued, in flight). Per trial:

  - first: fault -> the later survivor's first commit in a quorum without the victim;
  - stall: the longest time a survivor went without a commit in the window after the fault
    (the freeze's length, or 10 s after a kill), counted from the fault;
  - lost: outer steps the survivors attempted and did not commit in that window;
  - equal: whether every step committed by several replicas left them bitwise equal;
  - rebuilds: process-group configures per minute, survivors' mean, over the whole trial;
  - rejoin (restart): the restarted replica's start -> its first commit in a full quorum.

The Lighthouse's heartbeat timeout (`--heartbeat-ms`) and join timeout (`--lighthouse-join-ms`)
are the same for both groups.

    .venv/bin/python bench/torchft_faults.py --pg lowcomm,gloo --fault stop --trials 3
    .venv/bin/python bench/torchft_faults.py --pg lowcomm,gloo --matrix --trials 2
"""
import argparse
import faulthandler
import os
import signal
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.multiprocessing as mp

POINTS = {"inner": 1, "quorum": 2, "allreduce": 3}
VICTIM = 2
# The scenarios of --matrix: (fault, point).
MATRIX = [("kill", "inner"), ("kill", "quorum"), ("kill", "allreduce"), ("kill", "random"),
          ("stop", "inner"), ("stop", "quorum"), ("stop", "allreduce"), ("stop", "random"),
          ("restart", "random")]


def replica(idx, kind, lighthouse, cfg, events, stop, fault_at, fault_sig, fault_time):
    import hashlib

    import torch.distributed as dist
    import torchft.local_sgd as ls
    from torchft import Manager
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    # --dump-stalls: the parent asks a stalled survivor where its threads are.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if kind == "lowcomm":
        from lowcomm.torchft import ProcessGroupLowcomm
        pg = ProcessGroupLowcomm(timeout=timedelta(seconds=60))
    else:
        from torchft.process_group import ProcessGroupGloo
        pg = ProcessGroupGloo(timeout=timedelta(seconds=60))
    rebuilds = [0]
    real_configure = pg.configure

    def configure(*args, **kwargs):
        rebuilds[0] += 1
        return real_configure(*args, **kwargs)

    pg.configure = configure

    def maybe_fault(point):  # the victim stops or kills itself where it was asked to
        if fault_at.value == point:
            fault_at.value = 0
            fault_time.value = time.monotonic()
            os.kill(os.getpid(), fault_sig.value)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256))
    teacher = torch.nn.Linear(256, 256)
    gen = torch.Generator().manual_seed(100 + idx)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-3)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    store = dist.TCPStore("localhost", 0, 1, True, wait_for_workers=False)

    w = torch.zeros(1 << 20)  # --loop manager's state

    def load(sd):
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        w.copy_(sd["w"])

    manager = Manager(pg=pg, min_replica_size=2, use_async_quorum=False, load_state_dict=load,
                      state_dict=lambda: {"model": model.state_dict(),
                                          "inner": inner.state_dict(), "w": w},
                      replica_id=f"replica{idx}", store_addr="localhost", store_port=store.port,
                      rank=0, world_size=1, lighthouse_addr=lighthouse,
                      timeout=timedelta(seconds=60), quorum_timeout=timedelta(seconds=60))
    if idx == VICTIM:
        real_quorum = manager.start_quorum

        def start_quorum(*args, **kwargs):
            maybe_fault(POINTS["quorum"])
            return real_quorum(*args, **kwargs)

        manager.start_quorum = start_quorum
        frag = ls._StreamingDiLoCoFragment
        real_average = frag._average_grads

        def average(self):
            real_average(self)
            maybe_fault(POINTS["allreduce"])

        frag._average_grads = average
    t_start = time.monotonic()
    if cfg["loop"] == "manager":
        manager_loop(idx, manager, w, cfg, events, stop, maybe_fault)
        events.put(("rebuilds", idx, rebuilds[0], time.monotonic() - t_start))
        manager.shutdown(wait=False)
        return
    with DiLoCo(manager, [model], inner, outer, sync_every=cfg["sync_every"]):
        k = 0
        while not stop.is_set():
            x = torch.randn(64, 256, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), teacher(x).detach())
            inner.zero_grad()
            loss.backward()
            time.sleep(cfg["inner_s"])
            k += 1
            if idx == VICTIM and k % cfg["sync_every"] == 2:
                maybe_fault(POINTS["inner"])
            before = manager.current_step()
            inner.step()  # DiLoCo's hook runs the outer step every sync_every-th call
            if k % cfg["sync_every"] == 0:
                committed = manager.current_step() > before
                h = ""
                if committed:
                    m = hashlib.sha256()
                    for p in model.parameters():
                        m.update(p.detach().numpy().tobytes())
                    h = m.hexdigest()[:16]
                events.put(("step", idx, time.monotonic(), manager.num_participants(),
                            committed, manager.current_step(), h))
    events.put(("rebuilds", idx, rebuilds[0], time.monotonic() - t_start))
    manager.shutdown(wait=False)


def manager_loop(idx, manager, w, cfg, events, stop, maybe_fault):
    """--loop manager: no DiLoCo; each step is a quorum, `--inner-ms` of work and a 4 MiB
    all-reduce committed through the Manager into `w` (as a DDP step would be)."""
    import hashlib
    while not stop.is_set():
        manager.start_quorum()
        time.sleep(cfg["inner_s"] / 2)
        if idx == VICTIM:
            maybe_fault(POINTS["inner"])
        time.sleep(cfg["inner_s"] / 2)
        g = torch.ones(1 << 20)
        work = manager.allreduce(g)
        if idx == VICTIM:
            maybe_fault(POINTS["allreduce"])
        try:
            work.wait()
        except Exception:  # noqa: BLE001  (torchft reports it through should_commit)
            pass
        committed = manager.should_commit()
        h = ""
        if committed:
            w.add_(g)
            h = hashlib.sha256(w.numpy().tobytes()).hexdigest()[:16]
        events.put(("step", idx, time.monotonic(), manager.num_participants(), committed,
                    manager.current_step(), h))


def trial(kind, fault, point, a, seed):
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2,
                                  join_timeout_ms=a.lighthouse_join_ms,
                                  heartbeat_timeout_ms=a.heartbeat_ms)
    ctx = mp.get_context("spawn")
    events, stop = ctx.Queue(), ctx.Event()
    fault_at, fault_sig, fault_time = ctx.Value("i", 0), ctx.Value("i", 0), ctx.Value("d", 0.0)
    cfg = {"inner_s": a.inner_ms / 1e3, "sync_every": a.sync_every, "loop": a.loop}

    def start(i):
        p = ctx.Process(target=replica, args=(i, kind, lighthouse.address(), cfg, events, stop,
                                              fault_at, fault_sig, fault_time), daemon=True)
        p.start()
        return p

    procs = [start(i) for i in range(3)]
    seen, rebuilds = [], {}

    def drain(until):
        while time.monotonic() < until:
            try:
                e = events.get(timeout=max(0.01, until - time.monotonic()))
            except Exception:  # noqa: BLE001  (queue.Empty)
                continue
            if e[0] == "step":
                seen.append(e[1:])
            else:
                rebuilds.setdefault(e[1], []).append(e[2] / e[3] * 60)

    def commits(i, since=0.0):
        return [s for s in seen if s[0] == i and s[3] and s[1] > since]

    deadline = time.monotonic() + 180  # warm: every replica has committed a few outer steps
    while time.monotonic() < deadline and min(len(commits(i)) for i in range(3)) < 3:
        drain(time.monotonic() + 0.1)
    sig = signal.SIGSTOP if fault == "stop" else signal.SIGKILL
    if point == "random":
        step_s = a.inner_ms / 1e3 * (a.sync_every if a.loop == "diloco" else 1)
        drain(time.monotonic() + (seed % 7) / 7 * step_s)
        t_fault = time.monotonic()
        os.kill(procs[VICTIM].pid, sig)
    else:
        fault_sig.value = int(sig)
        fault_at.value = POINTS[point]
        until = time.monotonic() + 30
        while fault_time.value == 0.0 and time.monotonic() < until:
            drain(time.monotonic() + 0.005)
        t_fault = fault_time.value or time.monotonic()
    window = a.freeze_s if fault == "stop" else 10.0
    t_restart = rejoin = None
    if fault == "stop":
        if a.dump_stalls > 0:
            drain(t_fault + a.dump_stalls)
            for i in (i for i in range(3) if i != VICTIM and not commits(i, t_fault)):
                print(f"# replica {i}: no commit {a.dump_stalls:.0f} s after the freeze; its "
                      f"threads' stacks follow (stderr)", flush=True)
                os.kill(procs[i].pid, signal.SIGUSR1)
        drain(t_fault + window)
        os.kill(procs[VICTIM].pid, signal.SIGCONT)
        drain(time.monotonic() + 5)
    elif fault == "restart":
        drain(t_fault + 3.0)
        procs[VICTIM].join()
        t_restart = time.monotonic()
        procs[VICTIM] = start(VICTIM)
        until = t_restart + 60
        while time.monotonic() < until and not [s for s in commits(VICTIM, t_restart)
                                                if s[2] == 3]:
            drain(time.monotonic() + 0.1)
        full = [s for s in commits(VICTIM, t_restart) if s[2] == 3]
        rejoin = full[0][1] - t_restart if full else None
        drain(max(time.monotonic() + 2, t_fault + window))
    else:
        drain(t_fault + window)
    stop.set()
    drain(time.monotonic() + 5)
    for p in procs:
        p.kill()
        p.join()
    lighthouse.shutdown()
    survivors = [i for i in range(3) if i != VICTIM]
    end = t_fault + window
    without = [[s[1] for s in commits(i, t_fault) if s[2] == 2] for i in survivors]
    first = max(w[0] for w in without) - t_fault if all(without) else None
    stall = 0.0
    for i in survivors:
        ts = [t_fault] + [s[1] for s in commits(i, t_fault) if s[1] < end] + [end]
        stall = max(stall, max(b - x for x, b in zip(ts, ts[1:])))
    lost = sum(1 for s in seen if s[0] in survivors and t_fault < s[1] < end and not s[3])
    by_step = {}
    for s in seen:
        if s[3]:
            by_step.setdefault(s[4], set()).add(s[5])
    shared = [h for h in by_step.values()]
    equal = all(len(h) == 1 for h in shared)
    rate = statistics.mean(statistics.mean(rebuilds[i]) for i in survivors if i in rebuilds) \
        if any(i in rebuilds for i in survivors) else float("nan")
    return {"first": first, "stall": stall, "lost": lost, "equal": equal, "rebuilds": rate,
            "rejoin": rejoin, "restarted": t_restart is not None}


def fmt(x, unit="s"):
    return "never" if x is None else f"{x:.2f} {unit}".strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="lowcomm,gloo")
    ap.add_argument("--fault", default="stop", choices=["stop", "kill", "restart"])
    ap.add_argument("--at", default="random", choices=["random"] + list(POINTS))
    ap.add_argument("--matrix", action="store_true", help="every scenario of MATRIX")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--freeze-s", type=float, default=20.0)
    ap.add_argument("--loop", default="diloco", choices=["diloco", "manager"])
    ap.add_argument("--inner-ms", type=int, default=40, help="per inner step (diloco) or step")
    ap.add_argument("--sync-every", type=int, default=5)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--lighthouse-join-ms", type=int, default=100,
                    help="the Lighthouse's join timeout: how long a quorum waits for replicas "
                         "beyond min_replicas")
    ap.add_argument("--first-trial", type=int, default=0, help="seed of the first trial")
    ap.add_argument("--dump-stalls", type=float, default=0.0,
                    help="with --fault stop: this long after the freeze, a survivor without a "
                         "commit since prints its threads' Python stacks (0: never)")
    a = ap.parse_args()
    scenarios = MATRIX if a.matrix else [(a.fault, a.at)]
    what = (f"DiLoCo, H = {a.sync_every}, {a.inner_ms} ms inner steps" if a.loop == "diloco"
            else f"Manager steps of {a.inner_ms} ms + a 4 MiB all-reduce")
    print(f"# torchft {what}, 3 replicas, "
          f"freeze {a.freeze_s:.0f} s, Lighthouse heartbeat timeout {a.heartbeat_ms} ms; "
          f"torch {torch.__version__}", flush=True)
    print("# scenario          group   first   stall  lost  equal  rebuilds/min  rejoin",
          flush=True)
    for fault, point in scenarios:
        for kind in a.pg.split(","):
            rows = []
            for t in range(a.first_trial, a.first_trial + a.trials):
                r = trial(kind, fault, point, a, t)
                rows.append(r)
                print(f"  {fault + '@' + point:<16} {kind:>7} {fmt(r['first']):>7} "
                      f"{fmt(r['stall']):>7} {r['lost']:>5} {'yes' if r['equal'] else 'NO':>6} "
                      f"{r['rebuilds']:>13.1f}  {fmt(r['rejoin']) if r['restarted'] else '-'}",
                      flush=True)
            firsts = [r["first"] for r in rows if r["first"] is not None]
            print(f"= {fault + '@' + point:<16} {kind:>7} first median "
                  f"{fmt(statistics.median(firsts) if firsts else None)}, stall median "
                  f"{fmt(statistics.median(r['stall'] for r in rows))} max "
                  f"{fmt(max(r['stall'] for r in rows))}, lost {sum(r['lost'] for r in rows)}, "
                  f"equal {sum(r['equal'] for r in rows)}/{len(rows)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
