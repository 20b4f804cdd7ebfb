#!/usr/bin/env python3
"""A two-stage pipeline over an AQ-SGD link: a small byte-level GPT cut in two, each half in
its own process behind an emulated WAN link, activations sent as b-bit deltas against a
per-sample cache (lowcomm.aqsgd), gradients back at 8 bits.

    .venv/bin/python examples/pipeline_aqsgd.py --quick              # < 2 minutes, 2 cores
    .venv/bin/python examples/pipeline_aqsgd.py --runs fp32,direct2,aqsgd2 --seeds 1,2 \
        --wan bw=100mbit,rtt=50ms --out results/pipeline

Runs: "fp32" (activations and gradients as they are), "direct<b>" (activations quantized to
b bits), "aqsgd<b>" (AQ-SGD deltas of b bits; a sample's first appearance, i.e. the first
epoch, at full precision). "/bw<b>" after a run sets the backward gradients' bits (8 by
default: "aqsgd2/bw4" is AQ-SGD's fw2/bw4), "/bw<b>sr" rounds them stochastically.

Fine-tuning, as AQ-SGD was published (--pretrain N --shift swapcase): the whole model first
trains N steps on the corpus in the launching process (fp32, no pipeline; cached in <out>),
then the pipeline fine-tunes that model on a shifted distribution of the same bytes (every
letter's case swapped) for the epochs given, and validation is on the shifted held-out bytes. Training visits a fixed set of samples for several epochs (AQ-SGD
keys its cache by sample id). Schedule: GPipe, M micro-batches per step, stage 0 sends every
micro-batch's activation as soon as it is computed (sends do not block), stage 1 sends each
gradient back as soon as it has it. Each run prints validation loss, bytes per micro-batch,
wall time, time per step and compute utilisation, and writes <out>/pipeline-loss-vs-step.png,
<out>/pipeline-loss-vs-wall.png, a CSV and results.json.
"""
import argparse
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from lowcomm_examples import data, gpt, plot  # noqa: E402
from lowcomm_examples.launch import run_ranks  # noqa: E402


def parse_run(name):
    """'aqsgd2/bw4' -> ('aqsgd', 2, 4, ''); 'aqsgd2/bw4sr' -> ('aqsgd', 2, 4, ':sr');
    'fp32' -> ('fp32', 32, 32, '')."""
    if name == "fp32":
        return "fp32", 32, 32, ""
    m = re.fullmatch(r"(direct|aqsgd)([1-8])(?:/bw([48])(sr)?)?", name)
    if not m:
        raise SystemExit(f"pipeline_aqsgd: unknown run {name!r} (fp32, direct<b>, aqsgd<b>, "
                         f"each with an optional /bw4, /bw8, /bw4sr or /bw8sr)")
    return m.group(1), int(m.group(2)), int(m.group(3) or 8), ":sr" if m.group(4) else ""


def pretrained_path(args, seed):
    return os.path.join(args.out, f"pretrained-{args.model}-s{seed}-{args.pretrain}steps-"
                                  f"{args.data_bytes}bytes.pt")


def pretrain(args, seed):
    """The model every run of this seed fine-tunes: N steps of AdamW on the unshifted corpus,
    in this process (one thread per core), cached."""
    path = pretrained_path(args, seed)
    if os.path.exists(path):
        return
    cfg = gpt.QUICK if args.model == "quick" else gpt.FULL
    corpus = data.Corpus(args.data_bytes, seed=seed)
    model = gpt.GPT(cfg, seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1, betas=(0.9, 0.95))
    t0 = time.perf_counter()
    for step in range(args.pretrain):
        x, y = corpus.train_batch(step, batch=16, seq=cfg.seq)
        loss = gpt.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    shifted = data.Corpus(args.data_bytes, seed=seed, shift=args.shift)
    print(f"pretrained seed {seed}: {args.pretrain} steps in {time.perf_counter() - t0:.0f} s, "
          f"val loss {gpt.evaluate(model, corpus.val_batches(16, cfg.seq, 8)):.4f} on the "
          f"corpus, {gpt.evaluate(model, shifted.val_batches(16, cfg.seq, 8)):.4f} on the "
          f"{args.shift} shift", flush=True)
    torch.save(model.state_dict(), path + ".tmp")
    os.replace(path + ".tmp", path)


def stage_main(rank, args, run, seed, port, queue):
    torch.set_num_threads(1)
    if args.wan:
        os.environ["LOWCOMM_WAN"] = args.wan
    import lowcomm.torch  # noqa: F401  registers the backend
    from lowcomm.aqsgd import Link

    dist.init_process_group("lowcomm", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    mode, bits, bw_bits, bw_sr = parse_run(run)
    cfg = gpt.QUICK if args.model == "quick" else gpt.FULL
    corpus = data.Corpus(args.data_bytes, seed=seed, shift=args.shift)
    samples = corpus.samples(args.samples, cfg.seq)
    val = corpus.val_batches(args.micro_batch, cfg.seq, args.val_batches)
    model = gpt.GPT(cfg, seed=seed)
    if args.pretrain:
        model.load_state_dict(torch.load(pretrained_path(args, seed)))
    stage = gpt.split_stages(model, 2)[rank]
    opt = torch.optim.AdamW(stage.parameters(), lr=args.lr, weight_decay=0.0)
    shape = (cfg.seq, cfg.d_model)
    backward = "fp32" if mode == "fp32" else f"q{bw_bits}:block={args.block}{bw_sr}"
    main = Link(1 - rank, shape, mode=mode, bits=min(bits, 8), block=args.block,
                scales=args.scales, backward=backward, allow_low_bit_backward=bw_bits < 8,
                rotate=args.rotate)
    # --warmup-epochs: the first epochs send the activations exactly (gradients as in the
    # run; AQ-SGD's own first appearance of every sample then comes on top: one more epoch).
    warm = (Link(1 - rank, shape, mode="fp32", tag=300, backward=backward,
                 allow_low_bit_backward=bw_bits < 8)
            if args.warmup_epochs and mode != "fp32" else None)
    links = [main] + ([warm] if warm else [])
    link = main
    probe = Link(1 - rank, shape, mode="fp32", tag=500)  # validation: exact, not timed

    def evaluate():
        total = 0.0
        with torch.no_grad():
            for i, (x, y) in enumerate(val):
                ids = list(range(i * len(x), (i + 1) * len(x)))
                if rank == 0:
                    probe.send(stage(x), ids)
                else:
                    total += gpt.loss(stage(probe.recv(ids)), y).item()
        probe.flush()
        out = torch.tensor([total / len(val)], dtype=torch.float64)
        dist.broadcast(out, src=1)
        return out.item()

    curve = [(0, 0.0, evaluate())]
    dist.barrier()
    compute = evaluating = 0.0
    step_times = []
    start = time.perf_counter()
    step = 0
    for epoch in range(args.epochs):
        link = warm if warm is not None and epoch < args.warmup_epochs else main
        batches = list(samples.batches(epoch, args.micro_batch * args.micro_batches, seed=seed))
        for ids, x, y in batches:
            t_step = time.perf_counter()
            mbs = [(ids[i:i + args.micro_batch].tolist(), x[i:i + args.micro_batch],
                    y[i:i + args.micro_batch]) for i in range(0, len(ids), args.micro_batch)]
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                kept = []
                for mids, mx, _ in mbs:
                    t0 = time.perf_counter()
                    h = stage(mx)
                    compute += time.perf_counter() - t0
                    link.send(h.detach(), mids)
                    kept.append(h)
                for (mids, _, _), h in zip(mbs, kept):
                    g = link.recv_grad(mids)
                    t0 = time.perf_counter()
                    h.backward(g)
                    compute += time.perf_counter() - t0
            else:
                for mids, _, my in mbs:
                    a = link.recv(mids).requires_grad_()
                    t0 = time.perf_counter()
                    loss = gpt.loss(stage(a), my) * (len(mids) / len(ids))
                    loss.backward()
                    compute += time.perf_counter() - t0
                    link.send_grad(a.grad, mids)
            t0 = time.perf_counter()
            opt.step()
            compute += time.perf_counter() - t0
            link.flush()
            step += 1
            step_times.append((epoch, time.perf_counter() - t_step))
        t0 = time.perf_counter()
        if epoch == args.warmup_epochs:  # the per-step breakdown: the compressed epochs
            mark = (step, t0 - start - evaluating, compute, sum(x.link_s for x in links),
                    sum(x.wait_s for x in links))
        curve.append((step, t0 - start - evaluating, evaluate()))
        evaluating += time.perf_counter() - t0
    wall = time.perf_counter() - start - evaluating
    later = ([t for e, t in step_times if e > args.warmup_epochs] or
             [t for _, t in step_times])
    if args.epochs <= args.warmup_epochs + 1:
        mark = (0, 0.0, 0.0, 0.0, 0.0)
    link_s, wait_s = sum(x.link_s for x in links), sum(x.wait_s for x in links)
    bytes_sent = sum(x.bytes_sent for x in links)
    n_later = max(1, step - mark[0])
    # Per step after epoch 1, this stage: its model's compute, lowcomm's CPU work in the link
    # (codecs, cache, copies, Python), time blocked on the network, and the rest.
    breakdown = {
        "step": (wall - mark[1]) / n_later,
        "compute": (compute - mark[2]) / n_later,
        "lowcomm": (link_s - wait_s - mark[3] + mark[4]) / n_later,
        "network_wait": (wait_s - mark[4]) / n_later,
    }
    breakdown["other"] = breakdown["step"] - sum(v for k, v in breakdown.items() if k != "step")
    n_micro = step * args.micro_batches
    result = {
        "run": run, "seed": seed, "rank": rank, "params": model.n_params(),
        "final_val_loss": curve[-1][2], "curve": curve, "wall_s": wall, "compute_s": compute,
        "utilisation": compute / wall, "bytes_sent": bytes_sent,
        "bytes_per_micro_batch": bytes_sent / n_micro,
        "step_s_after_first_epoch": sorted(later)[len(later) // 2],
        "cache_bytes_per_sample": main.cache.bytes_per_sample if mode == "aqsgd" else 0,
        "breakdown_s": breakdown,
    }
    queue.put(result)
    dist.destroy_process_group()


def one_run(args, run, seed):
    results = run_ranks(stage_main, 2, (args, run, seed), args.timeout)
    r = dict(results[1])  # the loss is computed on stage 1
    r["wall_s"] = max(x["wall_s"] for x in results)
    r["utilisation"] = [x["utilisation"] for x in results]
    r["bytes_per_micro_batch"] = sum(x["bytes_per_micro_batch"] for x in results)
    r["step_s_after_first_epoch"] = max(x["step_s_after_first_epoch"] for x in results)
    r["cache_bytes_per_sample"] = results[0]["cache_bytes_per_sample"]
    r["breakdown_s"] = [x["breakdown_s"] for x in results]
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="fp32,direct2,aqsgd2")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--samples", type=int, default=1024, help="fixed training samples")
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=4, help="per step (GPipe)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--block", type=int, default=1024,
                    help="elements per quantization scale (AQ-SGD's code: one scale per "
                         "channel over a micro-batch's tokens, ~1024 values)")
    ap.add_argument("--scales", choices=("block", "channel"), default="block",
                    help="one quantization scale per --block elements, or per hidden channel "
                         "over a micro-batch's tokens (AQ-SGD's quantizer)")
    ap.add_argument("--rotate", action="store_true",
                    help="quantize after a randomized Hadamard rotation (block scales)")
    ap.add_argument("--warmup-epochs", type=int, default=0,
                    help="train the first epochs with exact activations (gradients as in the "
                         "run)")
    ap.add_argument("--pretrain", type=int, default=0,
                    help="fine-tune: pretrain the whole model this many steps first")
    ap.add_argument("--shift", choices=("none", "swapcase"), default="none",
                    help="the pipeline's data: the corpus, or a shifted one (fine-tuning)")
    ap.add_argument("--model", choices=("quick", "full"), default="quick")
    ap.add_argument("--data-bytes", type=int, default=8 << 20)
    ap.add_argument("--val-batches", type=int, default=16)
    ap.add_argument("--wan", default="", help="both stages' emulated link (LOWCOMM_WAN syntax)")
    ap.add_argument("--quick", action="store_true", help="a short run (< 2 minutes on 2 cores)")
    ap.add_argument("--out", default="pipeline-out")
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args()
    if args.quick:
        args.samples, args.epochs, args.val_batches = 128, 3, 4
        args.data_bytes = min(args.data_bytes, 2 << 20)
    runs = args.runs.split(",")
    for run in runs:
        if args.scales == "channel" and parse_run(run)[1] == 1:
            raise SystemExit(f"pipeline_aqsgd: {run}: 1-bit codes take block scales, not "
                             "--scales channel")
    os.makedirs(args.out, exist_ok=True)
    results = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        if args.pretrain:
            pretrain(args, seed)
        for run in runs:
            r = one_run(args, run, seed)
            results.append(r)
            print(f"{run:>8} seed {seed}: val loss {r['final_val_loss']:.4f} "
                  f"({'before fine-tuning' if args.pretrain else 'untrained'} "
                  f"{r['curve'][0][2]:.4f}), {r['bytes_per_micro_batch'] / 1e3:.1f} kB per "
                  f"micro-batch (both ways), wall {r['wall_s']:.1f} s, step "
                  f"{1e3 * r['step_s_after_first_epoch']:.0f} ms after epoch 1, compute "
                  f"utilisation {', '.join(f'{100 * u:.0f}%' for u in r['utilisation'])}",
                  flush=True)
            print("          per step after epoch 1, stage 0 | stage 1 (ms): " + " | ".join(
                ", ".join(f"{k.replace('_', ' ')} {1e3 * v:.0f}" for k, v in b.items())
                for b in r["breakdown_s"]), flush=True)
    plot.write_results(args.out, "pipeline", args, results)


if __name__ == "__main__":
    main()
