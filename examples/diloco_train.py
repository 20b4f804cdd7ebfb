#!/usr/bin/env python3
"""DiLoCo over lowcomm: a small byte-level GPT trained by W workers (processes, one per "site"),
each behind its own emulated WAN link, averaging a compressed pseudo-gradient every H steps.

    .venv/bin/python examples/diloco_train.py --quick                 # < 2 minutes, 2 cores
    .venv/bin/python examples/diloco_train.py --runs fp32,q4,q2+ef --seeds 1,2 \
        --wan bw=20mbit,rtt=100ms --overlap --out results/diloco

Each run prints, for the global model every workers holds: validation loss per outer step,
bytes sent per outer step, wall time and compute utilisation (time in inner steps / time
training, evaluation excluded), and writes <out>/diloco-loss-vs-step.png,
<out>/diloco-loss-vs-wall.png, a CSV and results.json.

Runs: "fp32" (exact), a lowcomm codec ("q8", "q4", "q4:sr", "q2", "q2:block=32", "q1"),
"+ef" for error feedback on each worker's quantization, "+ef2" for error feedback on the
workers' and the owners' quantizations, "+ef<decay>" (e.g. "+ef0.5") for worker error feedback
whose residual is scaled by <decay> before it is carried over, "+efl" for error feedback left
in each worker's own model (implicit, as CocktailSGD's workers; docs/training.md), "+sl<decay>"
(e.g. "topk:64/4096+q2+sl0.95") for SparseLoCo's rule: error feedback decayed by <decay> (0.95
when omitted) and the outer step without momentum at --sparseloco-lr. The data is the Python standard library's sources
(examples/lowcomm_examples/data.py); every worker draws its own shard.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lowcomm_examples import data, gpt, plot  # noqa: E402
from lowcomm_examples.launch import run_ranks  # noqa: E402


def parse_run(name):
    """'q2+ef' -> ('q2', True, None, 'diloco'); 'q2+ef0.5' -> ('q2', True, 0.5, 'diloco');
    'topk:64/4096+q2+sl0.9' -> ('topk:64/4096+q2', True, 0.9, 'sparseloco'); 'fp32' -> (None,
    False, None, 'diloco'). The suffix is the last '+' part when it starts with 'ef' or 'sl'
    (a sparse codec's own '+q2' is part of the codec)."""
    head, _, tail = name.rpartition("+")
    if not head or not (tail.startswith("ef") or tail.startswith("sl")):
        head, tail = name, ""
    codec = None if head == "fp32" else head
    if tail in ("", "ef", "ef2", "efl"):
        return codec, {"": False, "ef": True, "ef2": "both", "efl": "local"}[tail], None, "diloco"
    rule = "sparseloco" if tail.startswith("sl") else "diloco"
    try:
        decay = float(tail[2:]) if len(tail) > 2 else None
    except ValueError:
        raise SystemExit(f"diloco_train: unknown run suffix '+{tail}' in {name!r}")
    if decay is None and rule == "diloco":
        raise SystemExit(f"diloco_train: unknown run suffix '+{tail}' in {name!r}")
    return codec, True, decay, rule


def worker(rank, args, run, seed, port, queue):
    torch.set_num_threads(1)
    if args.wan:
        os.environ["LOWCOMM_WAN"] = args.wan
    import lowcomm.torch  # noqa: F401  registers the backend
    from lowcomm.diloco import DiLoCo

    dist.init_process_group("lowcomm", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.workers)
    # Evaluation's small all-reduces on a group of their own, so the DiLoCo group carries only
    # the outer steps (its statistics count them alone).
    eval_group = dist.new_group(backend="gloo")
    codec, ef, decay, rule = parse_run(run)
    cfg = gpt.QUICK if args.model == "quick" else gpt.FULL
    corpus = data.Corpus(args.data_bytes, seed=seed)
    val = corpus.val_batches(args.batch, cfg.seq, args.val_batches)[rank::args.workers]
    model = gpt.GPT(cfg, seed=seed)
    probe = gpt.GPT(cfg, seed=seed)  # evaluates the global parameters
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                              betas=(0.9, 0.95))
    warm = torch.optim.lr_scheduler.LambdaLR(inner, lambda s: min(1.0, (s + 1) / args.warmup))
    outer = DiLoCo(model, sync_every=args.H, codec=codec, error_feedback=ef,
                   error_feedback_decay=decay, overlap=args.overlap, fragments=args.fragments,
                   outer_lr=args.sparseloco_lr if rule == "sparseloco" else args.outer_lr,
                   outer_momentum=args.outer_momentum, delay=args.delay,
                   merge_alpha=args.merge_alpha, rule=rule)

    def evaluate():
        outer.load_global(probe)
        loss = torch.tensor([gpt.evaluate(probe, val) * len(val), len(val)], dtype=torch.float64)
        dist.all_reduce(loss, group=eval_group)  # exact, small
        return (loss[0] / loss[1]).item()

    curve = [(0, 0.0, evaluate())]
    dist.barrier(group=eval_group)
    compute = sync = evaluating = 0.0
    start = time.perf_counter()
    steps = args.H * args.outer_steps
    for step in range(steps):
        t0 = time.perf_counter()
        x, y = corpus.train_batch(step, rank, args.workers, args.batch, cfg.seq)
        loss = gpt.loss(model(x), y)
        inner.zero_grad(set_to_none=True)
        loss.backward()
        inner.step()
        warm.step()
        t1 = time.perf_counter()
        synced = outer.step()
        t2 = time.perf_counter()
        compute += t1 - t0
        sync += t2 - t1
        if synced and (step + 1) % args.H == 0 and step + 1 < steps:
            curve.append((step + 1, t2 - start - evaluating, evaluate()))
            evaluating += time.perf_counter() - t2
    t0 = time.perf_counter()
    outer.finish()
    sync += time.perf_counter() - t0
    wall = time.perf_counter() - start - evaluating
    curve.append((steps, wall, evaluate()))
    result = {
        "run": run, "seed": seed, "rank": rank, "params": model.n_params(),
        "final_val_loss": curve[-1][2], "curve": curve, "wall_s": wall,
        "compute_s": compute, "sync_s": sync, "utilisation": compute / wall,
        "bytes_sent": outer.bytes_sent, "outer_steps": args.outer_steps,
        "bytes_per_outer_step": outer.bytes_sent / max(1, sum(outer.rounds) / args.fragments),
        "comm_wait_s": outer.comm_wait_s, "corpus": corpus.sha256[:16],
        # What the last outer all-reduce put on the wire: its codec ("" exact), its payload and
        # the payload the same all-reduce sends uncompressed.
        "last_outer_op": {k: outer.last_stats[k] for k in (
            "codec", "payload_bytes_sent", "uncompressed_bytes_sent", "compression_ratio")},
    }
    queue.put(result)
    dist.destroy_process_group()


def one_run(args, run, seed):
    results = run_ranks(worker, args.workers, (args, run, seed), args.timeout)
    r0 = dict(results[0])
    # The global model is the same on every worker; time is the slowest worker's.
    r0["wall_s"] = max(r["wall_s"] for r in results)
    r0["utilisation"] = min(r["utilisation"] for r in results)
    r0["bytes_per_outer_step"] = sum(r["bytes_per_outer_step"] for r in results) / len(results)
    return r0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="fp32,q4", help="comma-separated runs (see the doc)")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--H", type=int, default=50, help="inner steps per outer step")
    ap.add_argument("--outer-steps", type=int, default=12)
    ap.add_argument("--overlap", nargs="?", const="delayed", default=False,
                    choices=("delayed", "eager"),
                    help="overlap the outer all-reduce with the next round: delayed (the default "
                         "with --overlap) or eager (Kale et al.'s eager update)")
    ap.add_argument("--fragments", type=int, default=1,
                    help="Streaming DiLoCo: fragments synchronised at staggered steps")
    ap.add_argument("--delay", type=int, default=0,
                    help="Streaming DiLoCo's tau: inner steps between sending a fragment's "
                         "average and applying it")
    ap.add_argument("--merge-alpha", type=float, default=0.5,
                    help="Streaming DiLoCo's alpha: the share of the local parameters kept when "
                         "a delayed average is applied")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9,
                    help="the outer Nesterov momentum (SparseLoCo runs: none)")
    ap.add_argument("--sparseloco-lr", type=float, default=1.0,
                    help="the outer learning rate of '+sl' runs (SparseLoCo: no momentum)")
    ap.add_argument("--lr", type=float, default=3e-3, help="inner AdamW learning rate")
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--model", choices=("quick", "full"), default="quick")
    ap.add_argument("--data-bytes", type=int, default=8 << 20)
    ap.add_argument("--val-batches", type=int, default=16)
    ap.add_argument("--wan", default="", help="each worker's emulated link (LOWCOMM_WAN syntax)")
    ap.add_argument("--quick", action="store_true", help="a short run (< 2 minutes on 2 cores)")
    ap.add_argument("--out", default="diloco-out")
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    if args.quick:
        args.H, args.outer_steps, args.val_batches = 20, 5, 8
        args.data_bytes = min(args.data_bytes, 2 << 20)
    os.makedirs(args.out, exist_ok=True)
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        for run in args.runs.split(","):
            r = one_run(args, run, seed)
            results.append(r)
            print(f"{run:>12} seed {seed}: val loss {r['final_val_loss']:.4f} "
                  f"(untrained {r['curve'][0][2]:.4f}), {r['bytes_per_outer_step'] / 1e6:.3f} MB "
                  f"sent per worker per outer step (codec {r['last_outer_op']['codec'] or 'none'}, "
                  f"compression {r['last_outer_op']['compression_ratio']:.1f}x), wall "
                  f"{r['wall_s']:.1f} s, compute "
                  f"utilisation {100 * r['utilisation']:.1f}% ({r['params']} parameters, "
                  f"{args.workers} workers, H {args.H}, {args.outer_steps} outer steps"
                  f"{', overlap ' + args.overlap if args.overlap else ''}"
                  f"{f', {args.fragments} fragments' if args.fragments > 1 else ''}"
                  f"{f', delay {args.delay}, alpha {args.merge_alpha}' if args.delay else ''})",
                  flush=True)
    plot.write_results(args.out, "diloco", args, results)


if __name__ == "__main__":
    main()
