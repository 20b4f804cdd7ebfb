#!/usr/bin/env python3
"""Real gradient and weight bytes for the lossless-compression measurement (docs/nccl-plugin.md).

Trains the examples' small GPT (examples/lowcomm_examples/gpt.py: byte-level, on the Python
standard library's source as text) for a few AdamW steps on the CPU, then writes, flattened in
parameter order, what NCCL would carry for it: the weights and the last step's gradients, each
as fp32 and as bf16 (weights_fp32.bin, grads_fp32.bin, weights_bf16.bin, grads_bf16.bin), and
model.txt describing the model and the run.

    .venv/bin/python plugins/nccl_net/bench/dump_gradients.py OUT_DIR [--steps 30]
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from lowcomm_examples import data, gpt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(n_layer=args.layers, n_head=4, d_model=args.d_model, seq=128)
    model = gpt.GPT(cfg, seed=0)
    corpus = data.Corpus(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        x, y = corpus.train_batch(step, batch=args.batch, seq=cfg.seq)
        opt.zero_grad(set_to_none=True)
        loss = gpt.loss(model(x), y)
        loss.backward()
        losses.append(loss.item())
        if step + 1 < args.steps:
            opt.step()  # the last step's gradients are kept as they are
    os.makedirs(args.out, exist_ok=True)
    params = [p for p in model.parameters()]
    weights = torch.cat([p.detach().reshape(-1) for p in params])
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    for name, t in (("weights", weights), ("grads", grads)):
        for dtype, suffix in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            path = os.path.join(args.out, f"{name}_{suffix}.bin")
            t.to(dtype).contiguous().view(torch.uint8).numpy().tofile(path)
    with open(os.path.join(args.out, "model.txt"), "w") as f:
        f.write(f"GPT {cfg} (examples/lowcomm_examples/gpt.py), {weights.numel()} parameters, "
                f"AdamW lr 1e-3, batch {args.batch} x {cfg.seq} bytes, {args.steps} steps; "
                f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; torch {torch.__version__}\n")
    print(open(os.path.join(args.out, "model.txt")).read().strip())


if __name__ == "__main__":
    main()
