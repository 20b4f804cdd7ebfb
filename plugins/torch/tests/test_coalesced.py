"""The coalesced collectives FSDP2, DTensor and torchtitan use, on lowcomm against Gloo.

Every rank joins a default Gloo group and a lowcomm group beside it, and runs the same thing
on both: coalesced all-gathers, reduce-scatters and all-reduces (through
dist._coalescing_manager and the functional collectives, mixed dtypes, several tensors per
dtype), DTensor redistributions, and FSDP2 (`fully_shard`) training steps. Exact collectives
must give Gloo's bits; so FSDP2 on lowcomm must end with Gloo's parameters bit for bit.
"""
from __future__ import annotations

import functools
import sys
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from _spawn import run_world

import lowcomm

FLOAT = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in FLOAT:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=torch.int64).to(dtype)


def equal(a: torch.Tensor, b: torch.Tensor, what: str, exact: bool = True) -> None:
    """Bitwise, or (exact=False, floats) to rounding: a sum of more than two floats depends on
    the order, and Gloo's ring adds them in another order than lowcomm's rank order."""
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if exact or a.dtype not in FLOAT:
        assert torch.equal(a, b), f"{what}: {a.flatten()[:6]} vs {b.flatten()[:6]}"
    else:
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), f"{what}: {(a - b).abs().max()}"


# Tensors of mixed dtypes and shapes, some dtypes more than once (so a dtype's tensors share
# one operation), one of them empty: lowcomm against the ranks' known inputs.
SHAPES = [((4, 3), torch.float32), ((5,), torch.int64), ((2, 2, 2), torch.float32),
          ((0,), torch.float32), ((6,), torch.bfloat16), ((3,), torch.float64),
          ((7,), torch.int32), ((2, 3), torch.float32), ((4,), torch.bool)]
# What a reduction takes here (no bool)
REDUCIBLE = [s for s in SHAPES if s[1] != torch.bool]
# Against Gloo: one dtype per call (Gloo's coalesced ops read every tensor as the first one's
# dtype: mixed lists come back as garbage from Gloo, torch 2.15).
GLOO_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]


def same_dtype(dtype: torch.dtype) -> list:
    return [((4, 3), dtype), ((5,), dtype), ((0,), dtype), ((2, 2, 2), dtype)]


def ins_of(rank: int, shapes: list, base: int) -> list[torch.Tensor]:
    return [rand(shape, dtype, base + 100 * rank + i) for i, (shape, dtype) in enumerate(shapes)]


def coalesced_gather(group, inputs: list[torch.Tensor], world: int) -> list[torch.Tensor]:
    outs = [torch.empty((world * t.shape[0],) + t.shape[1:], dtype=t.dtype) for t in inputs]
    with dist._coalescing_manager(group=group):
        for o, i in zip(outs, inputs):
            dist.all_gather_into_tensor(o, i, group=group)
    return outs


def coalesced_scatter(group, inputs: list[torch.Tensor], world: int, op) -> list[torch.Tensor]:
    outs = [torch.empty((t.shape[0] // world,) + t.shape[1:], dtype=t.dtype) for t in inputs]
    with dist._coalescing_manager(group=group):
        for o, i in zip(outs, inputs):
            dist.reduce_scatter_tensor(o, i, op=op, group=group)
    return outs


def coalesced_reduce(group, inputs: list[torch.Tensor], op) -> list[torch.Tensor]:
    outs = [t.clone() for t in inputs]
    with dist._coalescing_manager(group=group):
        for t in outs:
            dist.all_reduce(t, op=op, group=group)
    return outs


def rs_shapes(shapes: list, world: int) -> list:
    """Reduce-scatter inputs: dim 0 a multiple of `world` (each rank's slice), not empty."""
    out = []
    for i, (shape, dtype) in enumerate(shapes):
        rows = world * (2 + i % 3)
        out.append(((rows,) + shape[1:], dtype))
    return out


def ops_body(rank: int, world: int, lc) -> None:
    gloo = dist.group.WORLD
    two = world == 2  # a sum of two floats is the same in any order: Gloo's bits
    # all-gather into tensors, coalesced: mixed dtypes against the ranks' known inputs, one
    # dtype per call against Gloo too
    got = coalesced_gather(lc, ins_of(rank, SHAPES, 10), world)
    for i, (shape, dtype) in enumerate(SHAPES):
        want = torch.cat([ins_of(r, SHAPES, 10)[i] for r in range(world)])
        equal(got[i], want, f"all_gather_into_tensor coalesced #{i} {dtype}")
    for dtype in GLOO_DTYPES:
        mine, ref = (coalesced_gather(g, ins_of(rank, same_dtype(dtype), 20), world)
                     for g in (lc, gloo))
        for i, (a, b) in enumerate(zip(mine, ref)):
            equal(a, b, f"all_gather_into_tensor coalesced {dtype} #{i} (vs gloo)")
    # one tensor: straight into the output (the functional all-gather DTensor uses)
    one = funcol.wait_tensor(funcol.all_gather_tensor(rand((3, 4), torch.float32, 30 + rank),
                                                      0, lc))
    equal(one, torch.cat([rand((3, 4), torch.float32, 30 + r) for r in range(world)]),
          "functional all_gather_tensor")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the old names, which 2.11 has
        fc = funcol.all_gather_into_tensor_coalesced(ins_of(rank, SHAPES, 40), lc)
        fc = [funcol.wait_tensor(t) for t in fc]
    for i, t in enumerate(fc):
        want = torch.cat([ins_of(r, SHAPES, 40)[i] for r in range(world)])
        equal(t, want, f"functional all_gather_into_tensor_coalesced #{i}")

    # reduce-scatter into tensors, coalesced: each input holds `world` slices
    shapes = rs_shapes(REDUCIBLE, world)
    got = coalesced_scatter(lc, ins_of(rank, shapes, 50), world, dist.ReduceOp.SUM)
    for i, (shape, dtype) in enumerate(shapes):
        slices = [ins_of(r, shapes, 50)[i].chunk(world)[rank] for r in range(world)]
        want = torch.stack(slices).double().sum(0).to(dtype)
        equal(got[i], want, f"reduce_scatter_tensor coalesced #{i} {dtype}", False)
    for dtype in GLOO_DTYPES:
        ops = [dist.ReduceOp.SUM, dist.ReduceOp.MAX]
        ops += [dist.ReduceOp.AVG] if dtype in FLOAT else []
        for op in ops:
            shapes = rs_shapes(same_dtype(dtype), world)
            mine, ref = (coalesced_scatter(g, ins_of(rank, shapes, 60), world, op)
                         for g in (lc, gloo))
            for i, (a, b) in enumerate(zip(mine, ref)):
                equal(a, b, f"reduce_scatter_tensor coalesced {dtype} {op} #{i} (vs gloo)", two)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        fr = funcol.reduce_scatter_tensor_coalesced(ins_of(rank, shapes, 70), "sum",
                                                    [0] * len(shapes), lc)
        fr = [funcol.wait_tensor(t) for t in fr]
    ref = coalesced_scatter(gloo, ins_of(rank, shapes, 70), world, dist.ReduceOp.SUM)
    for i, (a, b) in enumerate(zip(fr, ref)):
        equal(a, b, f"functional reduce_scatter_tensor_coalesced #{i} (vs gloo)", two)

    # all-reduce, coalesced: mixed dtypes (each dtype's tensors in one operation)
    got = coalesced_reduce(lc, ins_of(rank, REDUCIBLE, 80), dist.ReduceOp.SUM)
    for i, (shape, dtype) in enumerate(REDUCIBLE):
        want = torch.stack([ins_of(r, REDUCIBLE, 80)[i] for r in range(world)])
        equal(got[i], want.double().sum(0).to(dtype), f"all_reduce coalesced #{i} {dtype}", False)
    for dtype in GLOO_DTYPES:
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.MIN):
            mine, ref = (coalesced_reduce(g, ins_of(rank, same_dtype(dtype), 90), op)
                         for g in (lc, gloo))
            for i, (a, b) in enumerate(zip(mine, ref)):
                equal(a, b, f"all_reduce coalesced {dtype} {op} #{i} (vs gloo)", two)
    fa = funcol.all_reduce_coalesced(ins_of(rank, same_dtype(torch.float32), 95), "sum", lc)
    ref = coalesced_reduce(gloo, ins_of(rank, same_dtype(torch.float32), 95), dist.ReduceOp.SUM)
    for i, (a, b) in enumerate(zip(fa, ref)):
        equal(funcol.wait_tensor(a), b, f"functional all_reduce_coalesced #{i} (vs gloo)", two)
    # a group that compresses the large float tensors: those go one by one under their own
    # error-feedback keys, the rest exactly, in one operation per dtype
    q = dist.new_group(backend="lowcomm", pg_options=lowcomm.torch.Options(
        codec="q8", codec_threshold=4096, error_feedback="address"))
    ts = [rand((2048,), torch.float32, 95 + rank), rand((5,), torch.float32, 96 + rank),
          rand((3000,), torch.float32, 97 + rank), rand((4,), torch.int64, 98 + rank)]
    exact = [t.clone() for t in ts]
    for t in exact:
        dist.all_reduce(t)  # Gloo
    with dist._coalescing_manager(group=q):
        for t in ts:
            dist.all_reduce(t, group=q)
    equal(ts[1], exact[1], "exact float in a compressing group", two)
    equal(ts[3], exact[3], "int64 in a compressing group")
    for i in (0, 2):
        assert not torch.equal(ts[i], exact[i]), "compressed, so not exact"
        assert torch.allclose(ts[i], exact[i], atol=0.05 * world), (ts[i] - exact[i]).abs().max()
    keys = lowcomm.torch.error_feedback_keys(q)
    assert len(keys) == 2 and all(k.startswith("ef/") for k in keys), keys
    # the ranks agree on every result (the compressed ones too)
    for t in ts:
        copies = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(copies, t)
        assert all(torch.equal(c, t) for c in copies)


def dtensor_body(rank: int, world: int, lc) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                          distribute_tensor)

    meshes = {"lowcomm": DeviceMesh.from_group(lc, "cpu"),
              "gloo": init_device_mesh("cpu", (world,))}
    results = {}
    for name, mesh in meshes.items():
        out = []
        for shape in ((8, 6), (5, 3)):  # even and uneven shards
            full = rand(shape, torch.float32, 7)  # the same on every rank
            d = distribute_tensor(full, mesh, [Shard(0)])
            out.append(d.full_tensor())
            equal(out[-1], full, f"{name} full_tensor {shape}")
            out.append(d.redistribute(mesh, [Replicate()]).to_local())
            r = distribute_tensor(full, mesh, [Replicate()])
            out.append(r.redistribute(mesh, [Shard(1)]).to_local())
            out.append(d.redistribute(mesh, [Shard(1)]).to_local())
            # Partial (each rank holds a summand): reduce to Replicate and to Shard(0)
            part = DTensor.from_local(
                rand(shape, torch.float32, 300 + rank), mesh, [Partial()])
            out.append(part.redistribute(mesh, [Replicate()]).to_local())
            out.append(part.redistribute(mesh, [Shard(0)]).to_local())
            # autograd through the gather (the backward is a reduce-scatter)
            leaf = distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
            (leaf.full_tensor() * (rank + 1)).sum().backward()
            out.append(leaf.grad.to_local())
        results[name] = out
    for i, (a, b) in enumerate(zip(results["lowcomm"], results["gloo"])):
        equal(a, b, f"DTensor result #{i} (lowcomm vs gloo)")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(
            [torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 16))
             for _ in range(3)])
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def fsdp_train(rank: int, mesh, steps: int) -> tuple[list[torch.Tensor], list[float]]:
    from torch.distributed.fsdp import fully_shard

    model = Net()
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 5, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return [p.full_tensor().detach().clone() for p in model.parameters()], losses


def fsdp_body(rank: int, world: int, lc) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    ref, ref_losses = fsdp_train(rank, init_device_mesh("cpu", (world,)), 5)
    got, losses = fsdp_train(rank, DeviceMesh.from_group(lc, "cpu"), 5)
    assert losses == ref_losses, (losses, ref_losses)
    for i, (a, b) in enumerate(zip(got, ref)):
        equal(a, b, f"FSDP2 parameter #{i} after 5 steps (lowcomm vs gloo)")


BODIES = {"ops": ops_body, "dtensor": dtensor_body, "fsdp": fsdp_body}


def worker(rank: int, world: int, init_file: str, errors, body: str) -> None:
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        BODIES[body](rank, world, lc)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def _run(body: str, world: int, tmp_path) -> None:
    run_world(functools.partial(worker, body=body), world, tmp_path)


@pytest.mark.parametrize("world", [2, 3])
def test_coalesced_ops_match_gloo(world, tmp_path):
    _run("ops", world, tmp_path)


def test_dtensor_redistribute_matches_gloo(tmp_path):
    _run("dtensor", 2, tmp_path)


def test_fsdp2_trains_as_on_gloo(tmp_path):
    _run("fsdp", 2, tmp_path)
