#!/usr/bin/env python3
"""DiLoCo on an elastic group (lowcomm.elastic): a worker dies in the middle of training and a new
one joins later, and the training's quality is compared with a run that has the same membership
schedule and no fault (docs/membership.md, "DiLoCo through a fault").

    .venv/bin/python examples/elastic_diloco.py --seeds 1,2 --out results/elastic-diloco

Three founding workers train the byte-level GPT of examples/diloco_train.py (QUICK) with AdamW
inner steps and a q4 DiLoCo outer step every H inner steps, for R rounds. Two schedules:

  fault: founder 2 is SIGKILLed a few milliseconds into round K's all-reduce (K = 10 of 30); the
         survivors' round completes without it (lowcomm retries it in the next view, with the
         inputs and error feedback untouched). At round J (20) a new worker joins through the
         store, fetches the global parameters, the outer momentum and the round count
         (DiLoCo.catch_up), and trains to the end.
  clean: the same membership, without a fault: founder 2 leaves the group cleanly where the
         other run kills it (before contributing to round K), and the same joiner enters at J.

Worker w draws the data shard of member id w (the joiner is member 3). Printed and written to
<out>/results.json: the validation loss of the global model every 5 rounds and at the end, per
schedule and seed, and a PNG of the curves. Since an aborted round leaves nothing behind, the
fault run should match the clean one exactly, not only within noise; the seeds give the noise.
"""
import argparse
import json
import os
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from lowcomm_examples import data, gpt  # noqa: E402

WORKERS_TOTAL = 4  # shards: 3 founders and the joiner


def train(args, seed, member, group, outer, model, opt, corpus, val, out, leave_round=None,
          kill_round=None):
    """Inner steps and outer steps until round args.rounds; member 0 records the curve."""
    cfg = gpt.QUICK
    probe = gpt.GPT(cfg, seed=seed)
    curve = []
    step = outer.rounds[0] * args.H
    final_view = None

    def record():
        outer.load_global(probe)
        curve.append((int(outer.rounds[0]), gpt.evaluate(probe, val)))

    if member == 0:
        record()
    while outer.rounds[0] < args.rounds:
        last_inner = outer.inner_steps % args.H == args.H - 1
        if last_inner and outer.rounds[0] == leave_round:
            group.close()  # leaves cleanly: the others form a view without this worker
            return
        x, y = corpus.train_batch(step, member, WORKERS_TOTAL, args.batch, cfg.seq)
        loss = gpt.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if last_inner and outer.rounds[0] == kill_round:
            threading.Timer(0.003, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        synced = outer.step()
        if synced and int(outer.rounds[0]) == args.rounds:
            final_view = list(group.view()[1])  # before anyone leaves at the end
        if synced and member == 0:
            r = int(outer.rounds[0])
            if r % 5 == 0 and r < args.rounds:
                record()
            if r == args.join_round:
                open(out + ".joinnow", "w").close()
    outer.finish()
    if member == 0:
        record()
    with open(f"{out}.{member}", "w") as f:
        json.dump({"member": member, "curve": curve, "view": final_view}, f)


def worker(member, args, seed, schedule, store_path, out, joiner=False):
    torch.set_num_threads(1)
    import lowcomm.diloco
    from lowcomm.elastic import ElasticGroup
    store = dist.FileStore(store_path, -1)
    if joiner:
        while not os.path.exists(out + ".joinnow"):
            time.sleep(0.01)
        group = ElasticGroup.join(store, failure_timeout=3.0)
        member = 3
    else:
        group = ElasticGroup.init(store, member, 3, bind="127.0.0.1", retries=2,
                                  failure_timeout=3.0)
    corpus = data.Corpus(args.data_bytes, seed=seed)
    val = corpus.val_batches(args.batch, gpt.QUICK.seq, args.val_batches)
    model = gpt.GPT(gpt.QUICK, seed=seed if not joiner else seed + 100)  # joiner: other weights
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
    outer = lowcomm.diloco.DiLoCo(model, group=group, sync_every=args.H, codec="q4",
                                  outer_lr=0.7)
    if joiner:
        outer.catch_up()
    fault = schedule == "fault" and member == 2
    clean_leave = schedule == "clean" and member == 2
    train(args, seed, member, group, outer, model, opt, corpus, val, out,
          leave_round=args.kill_round if clean_leave else None,
          kill_round=args.kill_round if fault else None)


def one_run(args, seed, schedule, tmp):
    ctx = mp.get_context("spawn")
    os.makedirs(tmp, exist_ok=True)
    for f in os.listdir(tmp):
        os.remove(os.path.join(tmp, f))
    store_path, out = os.path.join(tmp, "store"), os.path.join(tmp, "out")
    procs = [ctx.Process(target=worker, args=(m, args, seed, schedule, store_path, out))
             for m in range(3)]
    procs.append(ctx.Process(target=worker,
                             args=(0, args, seed, schedule, store_path, out, True)))
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=args.timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    want = [0, 0, -signal.SIGKILL if schedule == "fault" else 0, 0]
    if codes != want:
        raise SystemExit(f"{schedule} seed {seed}: exit codes {codes}, expected {want}")
    results = {}
    for m in (0, 1, 3):
        with open(f"{out}.{m}") as f:
            results[m] = json.load(f)
    views = {m: r["view"] for m, r in results.items()}
    return {"schedule": schedule, "seed": seed, "curve": results[0]["curve"], "views": views,
            "final_val_loss": results[0]["curve"][-1][1], "wall_s": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2")
    ap.add_argument("--H", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--kill-round", type=int, default=10)
    ap.add_argument("--join-round", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--data-bytes", type=int, default=2 << 20)
    ap.add_argument("--val-batches", type=int, default=16)
    ap.add_argument("--out", default="elastic-diloco-out")
    ap.add_argument("--timeout", type=float, default=1800)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for schedule in ("clean", "fault"):
            r = one_run(args, seed, schedule, os.path.join(args.out, f"tmp-{schedule}-{seed}"))
            results.append(r)
            print(f"{schedule:>6} seed {seed}: final val loss {r['final_val_loss']:.6f} "
                  f"(round 0: {r['curve'][0][1]:.4f}), {r['wall_s']:.1f} s", flush=True)
    by = {(r["schedule"], r["seed"]): r["final_val_loss"] for r in results}
    seeds = sorted({r["seed"] for r in results})
    gaps = [100 * (by[("fault", s)] / by[("clean", s)] - 1) for s in seeds]
    spread = (100 * (max(by[("clean", s)] for s in seeds) / min(by[("clean", s)] for s in seeds)
                     - 1) if len(seeds) > 1 else float("nan"))
    print(f"fault vs clean: {', '.join(f'{g:+.4f}%' for g in gaps)} (seed {seeds}); "
          f"clean runs across seeds differ by {spread:.2f}%")
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"args": vars(args), "results": results, "gap_pct": gaps,
                   "seed_spread_pct": spread}, f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in results:
            xs, ys = zip(*r["curve"])
            ax.plot(xs, ys, marker="o" if r["schedule"] == "fault" else "x",
                    linestyle="-" if r["schedule"] == "clean" else "--",
                    label=f"{r['schedule']} seed {r['seed']}")
        ax.axvline(args.kill_round, color="gray", lw=0.5)
        ax.axvline(args.join_round, color="gray", lw=0.5)
        ax.set_xlabel("outer round (worker 2 gone at 10, a new worker from 20)")
        ax.set_ylabel("validation loss (global model)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "elastic-diloco.png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()
