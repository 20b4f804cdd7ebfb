"""lowcomm.aqsgd_stages: a torch.distributed.pipelining trainer (PipelineStage, ScheduleGPipe
and Schedule1F1B) with an AQ-SGD link between its two stages: it trains like the same model
on one process (4-bit deltas, 8-bit gradients), and the two ends' caches end bit-identical."""
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
from torch import nn

from _spawn import run_world

import lowcomm.torch  # noqa: F401
from lowcomm.aqsgd import Link
from lowcomm import aqsgd_stages

pipelining = pytest.importorskip("torch.distributed.pipelining")

D, H, BATCH, MICRO, SAMPLES, EPOCHS = 8, 64, 8, 2, 32, 6


def full_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, 1))


class First(nn.Module):
    def __init__(self, part, link):
        super().__init__()
        self.part, self.send = part, aqsgd_stages.SendActivations(link)

    def forward(self, x, ids):
        return self.send(self.part(x), ids)


class Second(nn.Module):
    def __init__(self, part, link):
        super().__init__()
        self.part, self.recv = part, aqsgd_stages.RecvActivations(link)

    def forward(self, token, ids):
        return self.part(self.recv(token, ids))


def _train(rank, world, init_file, errors, schedule_name):
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        link = Link(1 - rank, (H,), group=dist.new_group(backend="lowcomm"), bits=4, block=64)
        model, ref = full_model(), full_model()
        part = model[:2] if rank == 0 else model[2:]
        mod = First(part, link) if rank == 0 else Second(part, link)
        mb = BATCH // MICRO
        io = (dict(input_args=torch.empty(mb, D), output_args=aqsgd_stages.token_like())
              if rank == 0 else
              dict(input_args=aqsgd_stages.token_like(), output_args=torch.empty(mb, 1)))
        stage = pipelining.PipelineStage(mod, rank, 2, torch.device("cpu"), **io)
        cls = {"gpipe": pipelining.ScheduleGPipe, "1f1b": pipelining.Schedule1F1B}[schedule_name]
        schedule = cls(stage, MICRO, loss_fn=nn.functional.mse_loss)
        g = torch.Generator().manual_seed(1)
        X, Y = torch.randn(SAMPLES, D, generator=g), torch.randn(SAMPLES, 1, generator=g)
        opt = torch.optim.SGD(part.parameters(), lr=0.05)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
        for epoch in range(EPOCHS):
            order = torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(epoch))
            for b in range(0, SAMPLES, BATCH):
                ids = order[b:b + BATCH]
                opt.zero_grad()
                losses = []
                if rank == 0:
                    schedule.step(X[ids], ids=ids)
                else:
                    schedule.step(ids=ids, target=Y[ids], losses=losses)
                link.flush()
                opt.step()
                # The reference: the whole model on this process, micro-batch losses averaged
                # as the schedule does.
                ref_opt.zero_grad()
                for i in range(0, BATCH, mb):
                    sel = ids[i:i + mb]
                    (nn.functional.mse_loss(ref(X[sel]), Y[sel]) / MICRO).backward()
                ref_opt.step()
        link.verify()  # both caches bit-identical
        assert len(link.cache) == SAMPLES and link.cache.updates == EPOCHS * SAMPLES // mb
        mine = torch.cat([p.detach().reshape(-1) for p in part.parameters()])
        theirs = torch.cat([p.detach().reshape(-1) for p in
                            (ref[:2] if rank == 0 else ref[2:]).parameters()])
        rel = ((mine - theirs).norm() / theirs.norm()).item()
        assert 0 < rel < 2e-2, rel  # compressed, so not exact; close to the uncompressed run
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def _gpipe(rank, world, init_file, errors):
    _train(rank, world, init_file, errors, "gpipe")


def _one_f_one_b(rank, world, init_file, errors):
    _train(rank, world, init_file, errors, "1f1b")


def test_gpipe_schedule_over_an_aqsgd_link(tmp_path):
    run_world(_gpipe, 2, tmp_path)


def test_1f1b_schedule_over_an_aqsgd_link(tmp_path):
    run_world(_one_f_one_b, 2, tmp_path)
