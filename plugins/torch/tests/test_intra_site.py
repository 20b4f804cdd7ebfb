"""UCX inside the site through torch (LOWCOMM_INTRA_SITE=ucx, docs/sites.md): the ranks of one
host exchange the collective payloads over UCX and get Gloo's bits, compared bitwise
(torch.equal) against a Gloo run of the same inputs, and the bits of lowcomm's TCP;
last_op_stats says how much went over UCX.

Where a float sum's bits depend on the order of its terms, Gloo and lowcomm legitimately
differ: lowcomm adds the ranks' contributions in rank order (docs/collectives.md), Gloo's ring
in an order of its own that varies by chunk (with 3 ranks of randn, ~21% of the elements differ
in their last bits). So the sums are compared bitwise with Gloo where the order cannot matter:
on 2 ranks (a + b == b + a) and on 3 ranks with values whose sums are exact in fp32; with
arbitrary floats on 3 ranks, against the rank-order sum of the inputs Gloo gathered."""
import os
import sys
import traceback

import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch

N = 1 << 20


def exact_values(n, generator):
    """fp32 values of 21 significant bits or fewer, with fractions: sums of three are exact in
    any order, so every reduction order gives the same bits."""
    return torch.randint(-(1 << 20), 1 << 20, (n,), generator=generator).float() * 2.0 ** -8


def ucx_group(ranks=None):
    os.environ["LOWCOMM_INTRA_SITE"] = "ucx"  # read when a communicator is made
    try:
        return dist.new_group(ranks=ranks, backend="lowcomm")
    finally:
        del os.environ["LOWCOMM_INTRA_SITE"]


def over_ucx(group, what):
    stats = lowcomm.torch.last_op_stats(group)
    assert stats["ucx_bytes_sent"] > 0, (what, stats)


def body(rank, world):
    tcp = dist.new_group(backend="lowcomm")
    ucx = ucx_group()
    # Every rank makes every group, in the same order: 2-rank ones on Gloo and lowcomm-UCX.
    gloo2 = dist.new_group(ranks=[0, 1], backend="gloo")
    ucx2 = ucx_group(ranks=[0, 1])
    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(N, generator=g)

    # Arbitrary floats, 3 ranks: the sum in rank order of the inputs Gloo gathered.
    every = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(every, x)  # Gloo
    in_rank_order = every[0].clone()
    for t in every[1:]:
        in_rank_order += t
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=tcp)
    dist.all_reduce(b, group=ucx)
    over_ucx(ucx, "all_reduce")
    assert lowcomm.torch.last_op_stats(tcp)["ucx_bytes_sent"] == 0
    assert torch.equal(a, b), "UCX and TCP all-reduces differ"
    assert torch.equal(b, in_rank_order), ("UCX all-reduce is not the rank-order sum",
                                           (b != in_rank_order).sum())

    # Sums exact in any order, 3 ranks: Gloo's all-reduce bit for bit.
    e = exact_values(N, g)
    ref, b = e.clone(), e.clone()
    dist.all_reduce(ref)  # Gloo
    dist.all_reduce(b, group=ucx)
    over_ucx(ucx, "all_reduce, exact values")
    assert torch.equal(ref, b), ("UCX all-reduce differs from Gloo's", (ref != b).sum())
    for op in (dist.ReduceOp.MAX, dist.ReduceOp.MIN):  # no rounding: arbitrary floats
        ref, b = x.clone(), x.clone()
        dist.all_reduce(ref, op=op)
        dist.all_reduce(b, op=op, group=ucx)
        assert torch.equal(ref, b), (op, (ref != b).sum())

    # Arbitrary floats, 2 ranks: Gloo's all-reduce bit for bit.
    if rank < 2:
        ref, b = x.clone(), x.clone()
        dist.all_reduce(ref, group=gloo2)
        dist.all_reduce(b, group=ucx2)
        over_ucx(ucx2, "all_reduce, 2 ranks")
        assert torch.equal(ref, b), ("2-rank UCX all-reduce differs from Gloo's",
                                     (ref != b).sum())

    # Reduce-scatter (exact values) and all-gather, broadcast (arbitrary floats) against Gloo.
    chunks = list(e[:N // world * world].view(world, -1))  # Gloo takes equal chunks only
    ref, b = torch.empty_like(chunks[0]), torch.empty_like(chunks[0])
    dist.reduce_scatter(ref, chunks)  # Gloo
    dist.reduce_scatter(b, chunks, group=ucx)
    over_ucx(ucx, "reduce_scatter")
    assert torch.equal(ref, b), ("UCX reduce-scatter differs from Gloo's", (ref != b).sum())
    out = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(out, x, group=ucx)
    over_ucx(ucx, "all_gather")
    for r, (t, want) in enumerate(zip(out, every)):
        assert torch.equal(t, want), ("UCX all-gather differs from Gloo's", r)
    ref, b = x.clone(), x.clone()
    dist.broadcast(ref, src=2)  # Gloo
    dist.broadcast(b, src=2, group=ucx)
    if rank == 2:  # the root sends
        over_ucx(ucx, "broadcast")
    assert torch.equal(ref, b), "UCX broadcast differs from Gloo's"

    # Compressed: no Gloo counterpart; the bits of the same call over TCP.
    c = x.clone()
    lowcomm.torch.all_reduce(c, codec="q4", group=ucx)
    over_ucx(ucx, "all_reduce q4")
    d = x.clone()
    lowcomm.torch.all_reduce(d, codec="q4", group=tcp)
    assert torch.equal(c, d), "q4 over UCX differs from q4 over TCP"
    assert not torch.equal(c, in_rank_order), "q4 gave the exact sum: nothing was quantized"


def worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        body(rank, world)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_ucx_inside_the_host_same_bits_as_gloo_and_tcp(tmp_path):
    run_world(worker, 3, tmp_path)
