"""UCX inside the site through torch (LOWCOMM_INTRA_SITE=ucx, docs/sites.md): the ranks of one
host exchange the collective payloads over UCX, with the bits Gloo's exact all-reduce gives and
the same as over lowcomm's TCP; last_op_stats says how much went over UCX."""
import os
import sys
import traceback

import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch


def body(rank, world):
    tcp = dist.new_group(backend="lowcomm")
    os.environ["LOWCOMM_INTRA_SITE"] = "ucx"  # read when a communicator is made
    ucx = dist.new_group(backend="lowcomm")
    del os.environ["LOWCOMM_INTRA_SITE"]
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(1 << 20, generator=g)
    ref, a, b = x.clone(), x.clone(), x.clone()
    dist.all_reduce(ref)  # Gloo
    dist.all_reduce(a, group=tcp)
    dist.all_reduce(b, group=ucx)
    assert torch.equal(a, b), "UCX and TCP all-reduces differ"
    assert torch.allclose(ref, b, rtol=1e-6, atol=1e-5), (ref - b).abs().max()
    assert lowcomm.torch.last_op_stats(tcp)["ucx_bytes_sent"] == 0
    stats = lowcomm.torch.last_op_stats(ucx)
    assert stats["ucx_bytes_sent"] > 0, stats
    # Compressed and the other collectives too.
    c = x.clone()
    lowcomm.torch.all_reduce(c, codec="q4", group=ucx)
    d = x.clone()
    lowcomm.torch.all_reduce(d, codec="q4", group=tcp)
    assert torch.equal(c, d), "q4 over UCX differs from q4 over TCP"
    out = [torch.empty(4096) for _ in range(world)]
    dist.all_gather(out, torch.full((4096,), float(rank)), group=ucx)
    for r, t in enumerate(out):
        assert torch.equal(t, torch.full((4096,), float(r))), r


def worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        body(rank, world)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_ucx_inside_the_host_same_bits_as_tcp(tmp_path):
    run_world(worker, 3, tmp_path)
