"""torchft's own DiLoCo over shaped links: ProcessGroupLowcomm with a codec against Gloo
(docs/torch.md, "torchft's DiLoCo over shaped links").

R replicas (processes, one per network namespace of scripts/wan_netns.sh, or on loopback
without --netns) train the same MLP on a regression task with torchft's Manager (synchronous
quorum, every replica in it) and torchft.local_sgd.DiLoCo (inner AdamW, outer Nesterov SGD,
sync every H inner steps, pseudo-gradients all-reduced per parameter through the process
group, or with --bucket-mb M in buckets of up to M MiB: torchft's use_bucketization). Every kind of group runs the same steps from the same seeds, one after the other; the
figures per kind (the slowest replica's, median over the outer steps after the first): the
outer step's wall time (H inner steps + the sync), the sync alone (the inner step that syncs:
quorum, pseudo-gradients, all-reduces, should_commit, outer optimizer), the all-reduces alone
(first issued to last waited for); then the evaluation loss after the last outer step, and
whether every replica ends with the same parameters.

    scripts/wan_netns.sh up 4 --rate 1gbit
    .venv/bin/python bench/torchft_diloco_wan.py --netns lc --replicas 4 --pg gloo,lowcomm-q4
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import timedelta


def build_model(hidden, layers, width_in):
    import torch.nn as nn
    mods, d = [], width_in
    for _ in range(layers - 1):
        mods += [nn.Linear(d, hidden), nn.ReLU()]
        d = hidden
    mods.append(nn.Linear(d, width_in))
    return nn.Sequential(*mods)


def replica_main(a):
    import socket

    import torch
    import torch.distributed as dist
    from torchft import Manager
    from torchft.local_sgd import DiLoCo

    torch.set_num_threads(1)
    socket.gethostname = lambda: a.ip  # torchft's checkpoint server advertises the hostname
    if a.kind == "gloo":
        from torchft.process_group import ProcessGroupGloo
        pg = ProcessGroupGloo(timeout=timedelta(seconds=120))
    else:
        from lowcomm.torchft import ProcessGroupLowcomm
        codec = a.kind.split("-", 1)[1] if "-" in a.kind else None
        # Buckets are fresh tensors at every sync (torchft allocates them): their residuals are
        # keyed by their place in the sequence of calls, not by their address.
        ef = ("order" if a.bucket_mb else "address") if codec else None
        pg = ProcessGroupLowcomm(timeout=timedelta(seconds=120), codec=codec, error_feedback=ef)
    torch.manual_seed(0)  # the same initial model on every replica
    model = build_model(a.hidden, a.layers, a.width)
    teacher = build_model(a.hidden // 4, 2, a.width)
    for p in teacher.parameters():
        p.requires_grad_(False)
    gen = torch.Generator().manual_seed(1000 + a.replica)  # this replica's data
    eval_gen = torch.Generator().manual_seed(7)
    x_eval = torch.randn(512, a.width, generator=eval_gen)
    y_eval = teacher(x_eval)
    inner = torch.optim.AdamW(model.parameters(), lr=a.inner_lr)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    store = dist.TCPStore(a.ip, 0, 1, True, wait_for_workers=False)
    manager = Manager(pg=pg, min_replica_size=a.replicas, use_async_quorum=False,
                      load_state_dict=lambda sd: model.load_state_dict(sd["model"]),
                      state_dict=lambda: {"model": model.state_dict()},
                      replica_id=f"replica{a.replica}", store_addr=a.ip, store_port=store.port,
                      rank=0, world_size=1, lighthouse_addr=a.lighthouse, hostname=a.ip,
                      timeout=timedelta(seconds=120), quorum_timeout=timedelta(seconds=120))
    outer_times, sync_times, comm_times = [], [], []
    # The all-reduce part of a sync: from the first pseudo-gradient all-reduce issued to the last
    # one waited for (torchft 0.2.0's _StreamingDiLoCoFragment: _average_grads, then wait()).
    import torchft.local_sgd as ls
    frag = ls._StreamingDiLoCoFragment
    real_average, real_wait, began = frag._average_grads, frag.wait, []

    def average(self):
        began.append(time.monotonic())
        return real_average(self)

    def wait(self):
        pending = len(self._allreduce_work) > 0
        real_wait(self)
        if pending:
            comm_times.append(time.monotonic() - began[-1])

    frag._average_grads, frag.wait = average, wait
    buckets = dict(use_bucketization=True, bucket_cap_mb=a.bucket_mb) if a.bucket_mb else {}
    with DiLoCo(manager, [model], inner, outer, sync_every=a.sync_every, **buckets):
        t_outer = time.monotonic()
        for step in range(a.outer_steps * a.sync_every):
            x = torch.randn(a.batch, a.width, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), teacher(x))
            inner.zero_grad()
            loss.backward()
            t0 = time.monotonic()
            inner.step()  # DiLoCo's hook syncs at every sync_every-th step
            if (step + 1) % a.sync_every == 0:
                now = time.monotonic()
                sync_times.append(now - t0)
                outer_times.append(now - t_outer)
                t_outer = now
    with torch.no_grad():
        eval_loss = torch.nn.functional.mse_loss(model(x_eval), y_eval).item()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    print(json.dumps({"replica": a.replica, "outer": outer_times, "sync": sync_times,
                      "comm": comm_times,
                      "eval_loss": eval_loss, "hash": h.hexdigest()[:16],
                      "params": sum(p.numel() for p in model.parameters()),
                      "commits": manager.current_step()}), flush=True)
    manager.shutdown(wait=False)


def run_kind(a, kind):
    from torchft.coordination import LighthouseServer
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=a.replicas, join_timeout_ms=100,
                                  heartbeat_timeout_ms=5000)
    port = lighthouse.address().rsplit(":", 1)[1]
    env = dict(os.environ, OMP_NUM_THREADS="1",
               LOWCOMM_DEBUG=os.environ.get("LOWCOMM_DEBUG", "WARN"))
    if a.netns:
        conf = dict(line.split("=", 1) for line in open(f"/run/lowcomm-wan/{a.netns}.conf")
                    .read().splitlines() if "=" in line)
        subnet = conf["SUBNET"]
        ips = [f"{subnet}.{k + 1}" for k in range(a.replicas)]
        lh = f"http://{subnet}.254:{port}"
        env.update(GLOO_SOCKET_IFNAME=f"{a.netns}eth0", LOWCOMM_SOCKET_IFNAME=f"={a.netns}eth0")
    else:
        ips = ["127.0.0.1"] * a.replicas
        lh = f"http://127.0.0.1:{port}"
        env.update(GLOO_SOCKET_IFNAME="lo", LOWCOMM_SOCKET_IFNAME="=lo")
    procs = []
    for k in range(a.replicas):
        cmd = [sys.executable, os.path.abspath(__file__), "--replica", str(k), "--kind", kind,
               "--ip", ips[k], "--lighthouse", lh] + a.passthrough
        if a.netns:
            cmd = ["ip", "netns", "exec", f"{a.netns}{k}"] + cmd
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True))
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=a.kind_timeout)
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        results.append(json.loads(lines[-1]) if lines else None)
    lighthouse.shutdown()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", default="gloo,lowcomm-q4",
                    help="kinds: gloo, lowcomm (exact), lowcomm-<codec>")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--netns", default="", help="namespace prefix of scripts/wan_netns.sh")
    ap.add_argument("--outer-steps", type=int, default=6)
    ap.add_argument("--sync-every", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--inner-lr", type=float, default=1e-3)
    ap.add_argument("--bucket-mb", type=int, default=0,
                    help="all-reduce the pseudo-gradients in buckets of up to this many MiB "
                         "(torchft's use_bucketization; default 0: one call per parameter)")
    ap.add_argument("--kind-timeout", type=float, default=1800)
    # A replica (started by the launcher).
    ap.add_argument("--replica", type=int, default=-1, help=argparse.SUPPRESS)
    ap.add_argument("--kind", default="", help=argparse.SUPPRESS)
    ap.add_argument("--ip", default="", help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.replica >= 0:
        return replica_main(a)
    a.passthrough = [f"--{k}={getattr(a, k.replace('-', '_'))}" for k in
                     ("replicas", "outer-steps", "sync-every", "hidden", "layers", "width",
                      "batch", "inner-lr", "bucket-mb")]
    import torch
    n_params = sum(p.numel() for p in build_model(a.hidden, a.layers, a.width).parameters())
    link = f"tbf namespaces {a.netns}" if a.netns else "loopback"
    print(f"# torchft DiLoCo, {a.replicas} replicas, {link}, {n_params / 1e6:.1f} M parameters "
          f"({n_params * 4 / 2**20:.0f} MiB fp32), H = {a.sync_every}, {a.outer_steps} outer "
          f"steps, {f'buckets of {a.bucket_mb} MiB' if a.bucket_mb else 'one call per parameter'}"
          f"; torch {torch.__version__}", flush=True)
    print(f"# {'group':>12} {'outer step s':>12} {'sync s':>8} {'all-reduce s':>12} "
          f"{'eval loss':>10} same  commits")
    for kind in a.pg.split(","):
        res = run_kind(a, kind)
        if any(r is None for r in res):
            print(f"  {kind:>12} failed: {res}", flush=True)
            continue
        # The slowest replica per outer step; the first outer step (warm-up) left out.
        outer = [max(r["outer"][i] for r in res) for i in range(1, a.outer_steps)]
        sync = [max(r["sync"][i] for r in res) for i in range(1, a.outer_steps)]
        comm = [max(r["comm"][i] for r in res) for i in range(1, a.outer_steps)]
        same = len({r["hash"] for r in res}) == 1
        print(f"  {kind:>12} {statistics.median(outer):12.2f} {statistics.median(sync):8.2f} "
              f"{statistics.median(comm):12.2f} "
              f"{statistics.mean(r['eval_loss'] for r in res):10.5f} {'yes' if same else 'NO':>4}"
              f"  {[r['commits'] for r in res]}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
