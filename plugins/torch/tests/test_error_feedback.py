"""Error-feedback state by name, in real processes (2 ranks): named residuals are kept apart,
resetting a name (or everything) starts it over from zero and frees it, a call without a name
keeps no residual, and the defaults of the group options and the DDP hook are as documented
(docs/torch.md, "Error feedback").

Codec q2 with round-to-nearest: the result of a call is a pure function of its input and the
residual, so "starts from zero" is checked bit for bit against a first call.
"""
from __future__ import annotations

import sys
import traceback

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _spawn import run_world

import lowcomm

keys = lowcomm.torch.error_feedback_keys
reset = lowcomm.torch.reset_error_feedback


def rand(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def named_body(rank: int, lc) -> None:
    x = rand(4096, 10 + rank)

    def ar(key: str, owner: bool = False) -> torch.Tensor:
        y = x.clone()
        lowcomm.torch.all_reduce(y, codec="q2", error_feedback_key=key, group=lc,
                                 owner_error_feedback=owner)
        return y

    first = ar("a")  # zero residual
    again = ar("a")  # carries what the first call lost
    assert not torch.equal(first, again)
    # a name of its own starts from zero, whatever "a" holds
    assert torch.equal(ar("b"), first)
    # no name: no residual, no state
    assert torch.equal(ar(""), first) and torch.equal(ar(""), first)
    assert keys(lc) == ["a", "b"], keys(lc)
    # a reset name starts over from zero; the others keep theirs
    assert reset(lc, "a") == 1
    assert keys(lc) == ["b"]
    assert torch.equal(ar("a"), first)
    assert torch.equal(ar("b"), again)
    # names are paths: resetting "m" drops "m" and "m/...", not "mm"
    for k in ("m", "m/w", "m/b", "mm"):
        ar(k)
    assert reset(lc, "m") == 3
    assert keys(lc) == ["a", "b", "mm"], keys(lc)
    assert reset(lc, "nothing/here") == 0
    assert reset(lc) == 3 and keys(lc) == []
    assert torch.equal(ar("b"), first)
    # state survives save/restore around a reset
    saved = lowcomm.torch._backend(lc).save_error_feedback()
    reset(lc)
    lowcomm.torch._backend(lc).restore_error_feedback(saved)
    assert keys(lc) == ["b"] and torch.equal(ar("b"), again)
    # error feedback over calls (both quantizations: the ranks' and the owners'): the sum of
    # what arrived tracks the sum of what was sent, far closer than any one call
    reset(lc)
    total_sent, total_got, single = torch.zeros(4096), torch.zeros(4096), []
    want = rand(4096, 10) + rand(4096, 11)
    for _ in range(20):
        got = ar("sum", owner=True)
        total_got += got
        total_sent += want
        single.append(((got - want).norm() / want.norm()).item())
    sum_err = ((total_got - total_sent).norm() / total_sent.norm()).item()
    assert sum_err < 0.2 * min(single), (sum_err, single)
    # refused, with the reason
    y = x.clone()
    with pytest.raises(ValueError, match="needs a lossy codec"):
        lowcomm.torch.all_reduce(y, error_feedback_key="k", group=lc)
    with pytest.raises(TypeError, match="residual's name"):
        lowcomm.torch.all_reduce(y, codec="q2", error_feedback_key=True, group=lc)
    with pytest.raises(ValueError, match="owner_error_feedback needs"):
        lowcomm.torch.all_reduce(y, codec="q2", owner_error_feedback=True, group=lc)
    with pytest.raises(ValueError, match="non-empty"):
        reset(lc, "")


def group_body(rank: int) -> None:
    # "address": one residual per buffer, under "ef/<address>/<shape>"
    g = dist.new_group(backend="lowcomm", pg_options=lowcomm.torch.Options(
        codec="q2", codec_threshold=1024, error_feedback="address"))
    bufs = [rand(1000, 20 + rank), rand(2000, 30 + rank)]
    for _ in range(2):
        for b in bufs:
            dist.all_reduce(b, group=g)
    dist.all_reduce(torch.ones(10), group=g)  # too small to compress: no residual
    ks = keys(g)
    assert len(ks) == 2 and all(k.startswith("ef/0x") for k in ks), ks
    assert reset(g, "ef") == 2 and keys(g) == []
    # "order": the k-th compressed call of a step, under "ef/order/<k>/<dtype+shape>"
    g = dist.new_group(backend="lowcomm", pg_options=lowcomm.torch.Options(
        codec="q2", codec_threshold=1024, error_feedback="order"))
    for _ in range(2):
        for n in (600, 700):
            dist.all_reduce(rand(n, n + rank), group=g)
    assert [k.split("/")[2] for k in keys(g)] == ["0", "1"], keys(g)
    assert reset(g) == 2
    # the order starts over: the next call is the first of a step again
    dist.all_reduce(rand(700, 1), group=g)
    assert len(keys(g)) == 1 and keys(g)[0].startswith("ef/order/0/"), keys(g)


def views_body(rank: int) -> None:
    """"address" keys name the user's tensor, also where it is not contiguous (the backend then
    all-reduces a contiguous copy made for the call, a new buffer each time): each view keeps its
    own residual across calls, exactly as a contiguous tensor with the same values does, under
    "ef/<address>/<shape>/<strides>". Keyed by the copy's address, the residuals were lost (a
    new address) or handed to another tensor (the freed copy's address reused by the next
    call's copy), and the results below differed from the contiguous twins' at the first such
    call."""
    def opts():
        return lowcomm.torch.Options(codec="q2", codec_threshold=1024, error_feedback="address")

    views = dist.new_group(backend="lowcomm", pg_options=opts())
    plain = dist.new_group(backend="lowcomm", pg_options=opts())  # same calls, contiguous
    base = torch.zeros(2, 1000, 2)
    a, b = base[0, :, 0], base[1, :, 1]  # every other element: stride 2, kept across steps
    assert not a.is_contiguous() and not b.is_contiguous()
    twins = [torch.zeros(1000), torch.zeros(1000)]
    for step in range(3):
        for i, (v, c) in enumerate(zip((a, b), twins)):
            x = rand(1000, 1000 * step + 100 * i + rank)
            v.copy_(x)
            c.copy_(x)
            dist.all_reduce(v, group=views)
            dist.all_reduce(c, group=plain)
            assert torch.equal(v, c), f"step {step}, view {i}: residual lost or mixed up"
    # the coalesced path (one work for the list) keys its compressed tensors alike
    for step in range(3):
        xs = [rand(1000, 7000 + 10 * step + i * 2 + rank) for i in range(2)]
        for v, c, x in zip((a, b), twins, xs):
            v.copy_(x)
            c.copy_(x)
        with dist._coalescing_manager(group=views):
            for v in (a, b):
                dist.all_reduce(v, group=views)
        with dist._coalescing_manager(group=plain):
            for c in twins:
                dist.all_reduce(c, group=plain)
        for i, (v, c) in enumerate(zip((a, b), twins)):
            assert torch.equal(v, c), f"step {step}, coalesced view {i}: residual lost or mixed up"
    assert keys(views) == sorted(f"ef/{hex(v.data_ptr())}/[1000]/[2]" for v in (a, b)), keys(views)
    assert keys(plain) == sorted(f"ef/{hex(c.data_ptr())}/[1000]" for c in twins), keys(plain)


def views_worker(rank: int, world: int, init_file: str, errors) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        views_body(rank)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


class Twisted(torch.nn.Module):
    """Parameters registered in another order than their gradients become ready, so DDP's
    bucket rebuild after the first step changes which parameters (and how many elements) each
    bucket index holds: first buckets [early (1 MiB + 32 KiB)], [late]; then one bucket of all
    (DDP's first bucket closes at 1 MiB)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.late = torch.nn.Linear(8192, 4)
        self.early = torch.nn.Linear(32, 8192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.late(torch.relu(self.early(x)))


def ddp_body(rank: int, lc) -> None:
    def train(model: torch.nn.Module, state, hook, steps: int) -> None:
        ddp = DDP(model, process_group=lc, bucket_cap_mb=0.1)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        g = torch.Generator().manual_seed(rank)
        for _ in range(steps):
            loss = ddp(torch.randn(16, 32, generator=g)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()

    reset(lc)
    # two models on one group, each hook under its own name
    s1, h1 = lowcomm.torch.ddp_comm_hook(codec="q4", group=lc, name="m1")
    s2, h2 = lowcomm.torch.ddp_comm_hook(codec="q4", group=lc)  # default name "ddp"
    train(Twisted(), s1, h1, 4)  # the buckets are rebuilt after step 1
    train(Twisted(), s2, h2, 2)
    ks = keys(lc)
    assert ks and all(k.startswith(("m1/bucket", "ddp/bucket")) for k in ks), ks
    assert any(k.startswith("m1/") for k in ks) and any(k.startswith("ddp/") for k in ks), ks
    n_m1 = sum(k.startswith("m1/") for k in ks)
    assert s1.reset() == n_m1
    assert all(k.startswith("ddp/") for k in keys(lc)), keys(lc)
    # without error feedback the hook keeps nothing
    s3, h3 = lowcomm.torch.ddp_comm_hook(codec="q4", error_feedback=False, group=lc, name="m3")
    train(Twisted(), s3, h3, 2)
    assert not any(k.startswith("m3") for k in keys(lc)), keys(lc)


def worker(rank: int, world: int, init_file: str, errors) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        named_body(rank, lc)
        group_body(rank)
        ddp_body(rank, lc)
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent (pytest.raises' too)
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_error_feedback_by_name(tmp_path):
    run_world(worker, 2, tmp_path)


def test_address_keys_follow_non_contiguous_tensors(tmp_path):
    run_world(views_worker, 2, tmp_path)
