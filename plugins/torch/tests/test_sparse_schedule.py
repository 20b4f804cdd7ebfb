"""Random-k's two all-reduce schedules through torch (Options(sparse_schedule=...), docs/sparse.md):
gather-all and owner each leave every rank with the same tensor, nonzero only on the positions
every rank shares; last_op_stats names the schedule and the density; a setting that is not a
schedule is refused when the group is made."""
import sys
import traceback

import pytest
import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch

CODEC = "randk:32/1024+q2"


def body(rank, world):
    n = 1 << 16
    x = torch.randn(n, generator=torch.Generator().manual_seed(3 + rank))
    exact = x.clone()
    dist.all_reduce(exact)  # Gloo
    kept = {}
    for schedule in ("gather-all", "owner"):
        opts = lowcomm.torch.Options(codec=CODEC, codec_threshold=0, sparse_schedule=schedule)
        group = dist.new_group(backend="lowcomm", pg_options=opts)
        y = x.clone()
        dist.all_reduce(y, group=group)
        stats = lowcomm.torch.last_op_stats(group)
        assert stats["schedule"] == schedule, stats
        assert stats["codec"] == CODEC, stats
        assert stats["density"] == pytest.approx(32 / 1024), stats
        everyone = [torch.empty_like(y) for _ in range(world)]
        dist.all_gather(everyone, y)  # Gloo: the replicas are identical
        for r, t in enumerate(everyone):
            assert torch.equal(t, y), f"{schedule}: rank {r} differs"
        nz = y != 0
        assert int(nz.sum()) <= n * 32 // 1024, int(nz.sum())
        kept[schedule] = nz
        # On the kept positions, the quantized sum follows the exact one.
        err = float((y[nz] - exact[nz]).norm() / exact[nz].norm())
        print(f"{schedule}: relative error on the kept positions {err:.3f}")
        assert err < 0.8, f"{schedule}: relative error {err:.3f}"
        dist.destroy_process_group(group)
    # Both schedules keep the same positions (they follow the seed and the step only; a kept
    # value may still round to zero).
    assert int((kept["gather-all"] | kept["owner"]).sum()) <= n * 32 // 1024
    with pytest.raises(ValueError, match="sparse_schedule"):
        dist.new_group(backend="lowcomm",
                       pg_options=lowcomm.torch.Options(codec=CODEC, sparse_schedule="sometimes"))


def worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        body(rank, world)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_randk_gather_all_and_owner_schedules(tmp_path):
    run_world(worker, 3, tmp_path)
