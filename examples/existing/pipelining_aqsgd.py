#!/usr/bin/env python3
"""A two-stage pipeline trainer built on torch.distributed.pipelining (PipelineStage,
ScheduleGPipe), the small byte-level GPT split in two, moved onto an AQ-SGD link.

The lines marked "aqsgd:" are the change from the plain PipelineStage trainer (docs/training.md
shows the diff): the activations travel over a lowcomm.aqsgd.Link, as b-bit deltas against a
per-sample cache, from inside the stage modules (SendActivations / RecvActivations), while
PipelineStage moves a one-float token; the sample ids ride along as a keyword input, which the
schedule splits into micro-batches like the batch.

    .venv/bin/python examples/existing/pipelining_aqsgd.py --bits 2 --epochs 3
    LOWCOMM_WAN=bw=100mbit,rtt=50ms .venv/bin/python examples/existing/pipelining_aqsgd.py
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

import lowcomm.torch  # noqa: F401  aqsgd: registers the "lowcomm" backend
from lowcomm import aqsgd_stages  # aqsgd:
from lowcomm.aqsgd import Link  # aqsgd:

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lowcomm_examples import data, gpt  # noqa: E402


def train(rank, args, port):
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    cfg = gpt.QUICK
    model = gpt.GPT(cfg, seed=args.seed)
    corpus = data.Corpus(2 << 20, seed=args.seed)
    samples = corpus.samples(args.samples, cfg.seq)
    link = Link(1 - rank, (cfg.seq, cfg.d_model), group=dist.new_group(backend="lowcomm"),  # aqsgd:
                bits=args.bits, block=1024)  # aqsgd:
    stage = gpt.split_stages(model, 2)[rank]
    module = (aqsgd_stages.SendingStage if rank == 0 else aqsgd_stages.ReceivingStage)(  # aqsgd:
        stage, link)  # aqsgd: (was module = stage)
    mb = args.batch // args.micro_batches
    io = (dict(input_args=torch.zeros(mb, cfg.seq, dtype=torch.long),  # aqsgd: shapes given,
               output_args=aqsgd_stages.token_like()) if rank == 0 else  # aqsgd: the token's
          dict(input_args=aqsgd_stages.token_like(),  # aqsgd:
               output_args=torch.zeros(mb, cfg.seq, 256)))
    pipe = PipelineStage(module, rank, 2, torch.device("cpu"), **io)
    schedule = ScheduleGPipe(pipe, args.micro_batches, loss_fn=gpt.loss)
    opt = torch.optim.AdamW(stage.parameters(), lr=3e-3, weight_decay=0.0)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        losses_epoch = []
        for ids, x, y in samples.batches(epoch, args.batch, seed=args.seed):
            if len(ids) < args.batch:
                continue
            opt.zero_grad(set_to_none=True)
            losses = []
            if rank == 0:
                schedule.step(x, ids=ids)  # aqsgd: ids=ids
            else:
                schedule.step(ids=ids, target=y, losses=losses)  # aqsgd: ids=ids
            link.flush()  # aqsgd:
            opt.step()
            losses_epoch += [float(v.detach()) for v in losses]
        if rank == 1:
            print(f"epoch {epoch}: train loss {sum(losses_epoch) / len(losses_epoch):.4f}, "
                  f"{time.perf_counter() - start:.1f} s, link {link.bytes_received / 1e3:.1f} kB "
                  "received", flush=True)
    link.verify()  # the two ends' caches are bit-identical
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    import torch.multiprocessing as mp
    from lowcomm_examples.launch import free_port
    mp.start_processes(train, args=(args, free_port()), nprocs=2, start_method="spawn")


if __name__ == "__main__":
    main()
