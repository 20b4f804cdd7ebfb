#!/usr/bin/env python3
"""A DiLoCo trainer written the way the public DiLoCo trainers are (OpenDiLoCo's
train_diloco_torch.py): inner AdamW, outer SGD with Nesterov momentum on the model's own
parameters, and an outer step that all-reduces each parameter's pseudo-gradient with one
synchronous `dist.all_reduce(param.grad, op=AVG)` per tensor.

Moved onto lowcomm by changing the backend line (and importing lowcomm.torch, which registers
the backend): the two lines marked "lowcomm:" below. Compression and error feedback come from
the group's options, here the environment:

    LOWCOMM_CODEC=q4 LOWCOMM_ERROR_FEEDBACK=order torchrun --nproc-per-node 4 \
        examples/existing/opendiloco_style.py

(error feedback "order": the script all-reduces a fresh tensor per parameter each outer step,
so residuals are keyed by the call's place in the step, not by address; docs/torch.md).
Without torchrun: `--spawn 4` starts the workers itself. It prints the time of each outer
step, which docs/training.md compares with lowcomm.diloco's bucketed step, and what rank 0 put
on the wire in it against the same all-reduces uncompressed (the lines marked "report:", not
part of the move: lowcomm's per-operation statistics).
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import lowcomm.torch  # noqa: F401  lowcomm: registers the "lowcomm" backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lowcomm_examples import data, gpt  # noqa: E402


def train(args):
    torch.set_num_threads(1)
    dist.init_process_group(backend="lowcomm")  # lowcomm: was backend="nccl"
    rank, world = dist.get_rank(), dist.get_world_size()
    corpus = data.Corpus(2 << 20, seed=args.seed)
    model = gpt.GPT(gpt.QUICK if args.model == "quick" else gpt.FULL, seed=args.seed)
    inner_optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1,
                                        betas=(0.9, 0.95))
    outer_optimizer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    params_offloaded = [p.detach().clone() for p in model.parameters()]
    outer_times = []
    for step in range(1, args.steps + 1):
        x, y = corpus.train_batch(step, rank, world, 16, model.cfg.seq)
        loss = gpt.loss(model(x), y)
        loss.backward()
        inner_optimizer.step()
        inner_optimizer.zero_grad()
        if step % args.local_steps == 0:
            t0 = time.perf_counter()
            sent, fp32, codecs = 0, 0, set()  # report: payload bytes, as fp32, codecs
            for param_offloaded, param in zip(params_offloaded, model.parameters()):
                param.grad = param_offloaded - param.data
                dist.all_reduce(tensor=param.grad, op=dist.ReduceOp.AVG)
                stats = lowcomm.torch.last_op_stats()  # report:
                sent += stats["payload_bytes_sent"]  # report:
                fp32 += stats["uncompressed_bytes_sent"]  # report:
                codecs.add(stats["codec"] or "none")  # report:
                param.data = param_offloaded
            outer_optimizer.step()
            outer_optimizer.zero_grad()
            params_offloaded = [p.detach().clone() for p in model.parameters()]
            outer_times.append(time.perf_counter() - t0)
            if rank == 0:
                print(f"step {step}: loss {loss.item():.4f}, outer step {outer_times[-1]:.3f} s "
                      f"({len(params_offloaded)} all-reduces, {sent / 1e3:.1f} kB payload sent, "
                      f"{fp32 / 1e3:.1f} kB uncompressed, codec {','.join(sorted(codecs))})",
                      flush=True)
    if rank == 0:
        print(f"outer step median {sorted(outer_times)[len(outer_times) // 2]:.3f} s over "
              f"{len(outer_times)} outer steps", flush=True)
    dist.destroy_process_group()


def _spawned(rank, args, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(args.spawn), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    train(args)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--local-steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--model", choices=("quick", "full"), default="quick")
    ap.add_argument("--spawn", type=int, default=0, help="start this many workers (no torchrun)")
    args = ap.parse_args()
    if not args.spawn:
        train(args)
        return
    import torch.multiprocessing as mp
    from lowcomm_examples.launch import free_port
    mp.start_processes(_spawned, args=(args, free_port()), nprocs=args.spawn,
                       start_method="spawn")


if __name__ == "__main__":
    main()
