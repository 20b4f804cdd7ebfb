"""DDP on the lowcomm backend: exact mode trains bitwise like Gloo (2 ranks: a sum of two
values does not depend on the order); the compressed hook (q8, error feedback per bucket)
follows the same losses and weights closely, and its state saves and restores;
lowcomm.torch.all_reduce takes a codec per call."""
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _spawn import run_world

import lowcomm.torch


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))


def train(rank, group, steps, hook=None):
    model = DDP(make_model(), process_group=group, bucket_cap_mb=0.05)  # several buckets
    if hook is not None:
        model.register_comm_hook(*hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(32, 64, generator=g)
        y = torch.randn(32, 8, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return [p.detach().clone() for p in model.parameters()], losses


def body(rank, world):
    lc = dist.new_group(backend="lowcomm")
    ref, ref_losses = train(rank, None, 6)  # default group: Gloo
    exact, _ = train(rank, lc, 6)
    for a, b in zip(ref, exact):
        assert torch.equal(a, b), "exact DDP on lowcomm differs from Gloo"
    state, hook = lowcomm.torch.ddp_comm_hook(codec="q8", error_feedback=True, group=lc)
    comp, losses = train(rank, lc, 6, (state, hook))
    for a, b in zip(ref, comp):
        assert torch.allclose(a, b, atol=2e-2), (a - b).abs().max()
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 0.02 * abs(b), (losses, ref_losses)
    saved = state.save()
    assert isinstance(saved, bytes) and len(saved) > 0
    state.load(saved)
    # One call with its own codec; error feedback under a key of the caller's choosing.
    t = torch.full((4096,), float(rank + 1))
    lowcomm.torch.all_reduce(t, codec="q8", error_feedback_key="once", group=lc)
    # q8 on a constant: the top of the grid is 127/128 of the absmax, twice (sender, owner).
    assert torch.allclose(t, torch.full((4096,), float(sum(range(1, world + 1)))), rtol=0.02)
    stats = lowcomm.torch.last_op_stats(lc)
    assert stats["codec"] == "q8" and stats["compression_ratio"] > 3, stats
    # One host: owner shares stay equal (docs/sites.md); the fields are there.
    assert stats["shares"] == [] and stats["rate_estimate"] == 0.0, stats
    # A group whose options compress every float all-reduce of at least 1 KiB; smaller and
    # integer ones stay exact; a bad codec is refused when the group is made.
    q4 = dist.new_group(backend="lowcomm",
                        pg_options=lowcomm.torch.Options(codec="q4", codec_threshold=1024))
    big = torch.linspace(-1, 1, 4096) * (rank + 1)
    dist.all_reduce(big, group=q4)
    assert lowcomm.torch.last_op_stats(q4)["codec"] == "q4"
    small = torch.ones(16)
    dist.all_reduce(small, group=q4)
    assert lowcomm.torch.last_op_stats(q4)["codec"] == "" and torch.equal(small, torch.full((16,), 2.0))
    try:
        dist.new_group(backend="lowcomm", pg_options=lowcomm.torch.Options(codec="q3x"))
    except Exception as e:  # noqa: BLE001
        assert "q3x" in str(e), e
    else:
        raise AssertionError("a bad codec must be refused")


def worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        body(rank, world)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_ddp_exact_matches_gloo_and_the_compressed_hook_trains(tmp_path):
    world = 2
    run_world(worker, world, tmp_path)
