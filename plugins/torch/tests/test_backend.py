"""lowcomm's torch.distributed backend in real processes, against Gloo and exact references.

Each rank joins a default Gloo group (file:// rendezvous) and a lowcomm group made with
new_group(backend="lowcomm") beside it. Inputs are seeded per rank, so every rank can compute
every op's exact result itself; where Gloo supports the dtype and op, the same call through
Gloo must give the same result too. Integers and bool must match exactly; floats to rounding.
"""
import datetime
import functools
import os
import sys
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch  # noqa: F401  (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int16, torch.int32, torch.int64, torch.bool]
FLOAT = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def rand(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype in FLOAT:
        return (torch.rand(shape, generator=g, dtype=torch.float64) * 4 - 2).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 4, shape, generator=g, dtype=torch.int64).to(dtype)
    return torch.randint(-3, 4, shape, generator=g, dtype=torch.int64).to(dtype)


def ops_for(dtype):
    R = dist.ReduceOp
    if dtype == torch.bool:
        return [R.SUM, R.MIN, R.MAX, R.PRODUCT]
    ops = [R.SUM, R.MIN, R.MAX, R.PRODUCT]
    if dtype not in FLOAT:
        ops += [R.BAND, R.BOR, R.BXOR]
    return ops


GLOO_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
               torch.uint8, torch.int32, torch.int64}


def reference(inputs, op, dtype):
    """op over the ranks' inputs, in the dtype's own semantics (wrap-around integers)."""
    R = dist.ReduceOp
    st = torch.stack(inputs)
    if dtype == torch.bool:
        return st.any(0) if op in (R.SUM, R.MAX) else st.all(0)
    if op == R.SUM:
        return st.double().sum(0).to(dtype) if dtype in FLOAT else st.sum(0).to(dtype)
    if op == R.PRODUCT:
        return st.double().prod(0).to(dtype) if dtype in FLOAT else st.prod(0).to(dtype)
    if op == R.MIN:
        return st.amin(0)
    if op == R.MAX:
        return st.amax(0)
    f = {R.BAND: torch.bitwise_and, R.BOR: torch.bitwise_or, R.BXOR: torch.bitwise_xor}[op]
    return functools.reduce(f, inputs)


def same(a, b, dtype, what):
    if dtype in FLOAT:
        tol = {torch.float16: 1e-2, torch.bfloat16: 5e-2}.get(dtype, 1e-5)
        ok = torch.allclose(a.double(), b.double(), rtol=tol, atol=tol, equal_nan=True)
    else:
        ok = torch.equal(a, b)
    assert ok, f"{what}: lowcomm {a.flatten()[:8]} vs gloo {b.flatten()[:8]}"


def body(rank, world, lc):
    n = 1000 + 7
    for dtype in DTYPES:
        for op in ops_for(dtype):
            what = f"all_reduce {dtype} {op}"
            a = rand((n,), dtype, 100 + rank)
            dist.all_reduce(a, op=op, group=lc)
            want = reference([rand((n,), dtype, 100 + r) for r in range(world)], op, dtype)
            same(a, want, dtype, what)
            if dtype in GLOO_DTYPES and dtype != torch.bfloat16:
                b = rand((n,), dtype, 100 + rank)
                dist.all_reduce(b, op=op)
                same(a, b, dtype, what + " (vs gloo)")
        gloo = dtype in GLOO_DTYPES and dtype != torch.bfloat16
        SUM = dist.ReduceOp.SUM
        # broadcast from every root, into a non-contiguous tensor (a column slice)
        for root in range(world):
            base = rand((41, 3), dtype, 50 + rank)
            t = base[:, 1]
            assert not t.is_contiguous()
            dist.broadcast(t, src=root, group=lc)
            same(t, rand((41, 3), dtype, 50 + root)[:, 1], dtype, f"broadcast {dtype} root {root}")
            if gloo:
                r = rand((41, 3), dtype, 50 + rank)[:, 1].clone()
                dist.broadcast(r, src=root)
                same(t, r, dtype, f"broadcast {dtype} root {root} (vs gloo)")
        # all_gather (list and into_tensor)
        inp = rand((17,), dtype, 300 + rank)
        want = [rand((17,), dtype, 300 + r) for r in range(world)]
        outs = [torch.empty_like(inp) for _ in range(world)]
        dist.all_gather(outs, inp, group=lc)
        for o, w in zip(outs, want):
            same(o, w, dtype, f"all_gather {dtype}")
        if gloo:
            refs = [torch.empty_like(inp) for _ in range(world)]
            dist.all_gather(refs, inp)
            for o, r in zip(outs, refs):
                same(o, r, dtype, f"all_gather {dtype} (vs gloo)")
        flat = torch.empty(world * 17, dtype=dtype)
        dist.all_gather_into_tensor(flat, inp, group=lc)
        same(flat, torch.cat(want), dtype, f"all_gather_into_tensor {dtype}")
        # reduce_scatter (list and tensor)
        def chunks_of(r):
            return [rand((9,), dtype, 400 + r * 10 + j) for j in range(world)]
        want = reference([chunks_of(r)[rank] for r in range(world)], SUM, dtype)
        out = torch.empty(9, dtype=dtype)
        dist.reduce_scatter(out, chunks_of(rank), group=lc)
        same(out, want, dtype, f"reduce_scatter {dtype}")
        dist.reduce_scatter_tensor(out, torch.cat(chunks_of(rank)), group=lc)
        same(out, want, dtype, f"reduce_scatter_tensor {dtype}")
        for root in range(world):
            t = rand((23,), dtype, 500 + rank)
            dist.reduce(t, dst=root, group=lc)
            if rank == root:
                want = reference([rand((23,), dtype, 500 + r) for r in range(world)], SUM, dtype)
                same(t, want, dtype, f"reduce {dtype} root {root}")
            g_out = [torch.empty(5, dtype=dtype) for _ in range(world)] if rank == root else None
            dist.gather(rand((5,), dtype, 600 + rank), g_out, dst=root, group=lc)
            if rank == root:
                for r, o in enumerate(g_out):
                    same(o, rand((5,), dtype, 600 + r), dtype, f"gather {dtype}")
            s_in = [rand((6,), dtype, 700 + j) for j in range(world)] if rank == root else None
            s_out = torch.empty(6, dtype=dtype)
            dist.scatter(s_out, s_in, src=root, group=lc)
            same(s_out, rand((6,), dtype, 700 + rank), dtype, f"scatter {dtype}")
        # all_to_all_single, uneven splits: rank j sends k + j + 1 rows to rank k
        def src_of(j):
            return rand((sum(k + j + 1 for k in range(world)), 2), dtype, 800 + j)
        in_splits = [k + rank + 1 for k in range(world)]
        out_splits = [rank + j + 1 for j in range(world)]
        o = torch.empty((sum(out_splits), 2), dtype=dtype)
        dist.all_to_all_single(o, src_of(rank), out_splits, in_splits, group=lc)
        want = torch.cat([src_of(j)[sum(k + j + 1 for k in range(rank)):][:rank + j + 1]
                          for j in range(world)])
        same(o, want, dtype, f"all_to_all_single {dtype}")
        # all_to_all (lists): rank j sends rank k a tensor of k + 2 * j + 1 elements
        def piece(j, k):
            return rand((k + 2 * j + 1,), dtype, 900 + 10 * j + k)
        outs = [torch.empty(rank + 2 * j + 1, dtype=dtype) for j in range(world)]
        dist.all_to_all(outs, [piece(rank, k) for k in range(world)], group=lc)
        for j in range(world):
            same(outs[j], piece(j, rank), dtype, f"all_to_all {dtype} from {j}")
        # all_gather_coalesced: two inputs of different shapes, one list per rank
        def coalesced_in(r):
            return [rand((3, 2), dtype, 1000 + r), rand((5,), dtype, 1100 + r)]
        lists = [[torch.empty_like(t) for t in coalesced_in(rank)] for _ in range(world)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch deprecates the call, not the op
            dist.all_gather_coalesced(lists, coalesced_in(rank), group=lc)
        for r in range(world):
            for got, want in zip(lists[r], coalesced_in(r)):
                same(got, want, dtype, f"all_gather_coalesced {dtype} rank {r}")
    # point to point, async, futures
    if world >= 2:
        t = torch.arange(10, dtype=torch.float32) * (rank + 1)
        if rank == 0:
            dist.send(t, dst=1, group=lc)
        elif rank == 1:
            got = torch.empty(10)
            dist.recv(got, src=0, group=lc)
            assert torch.equal(got, torch.arange(10, dtype=torch.float32))
        # Under no_grad, into a column (not contiguous: copied back at completion, on lowcomm's
        # executor) of a leaf that requires grad: the copy back runs with the caller's grad
        # mode, and without autograd, so it neither fails on another thread nor is recorded.
        with torch.no_grad():
            w = torch.zeros(10, 3, requires_grad=True)
            if rank == 0:
                dist.send(t, dst=1, group=lc)
            elif rank == 1:
                work = dist.irecv(w[:, 1], src=0, group=lc)
                work.wait()
                assert torch.equal(w[:, 1], torch.arange(10, dtype=torch.float32)), w[:, 1]
                assert w.grad_fn is None and w.requires_grad
    # sparse COO all_reduce (SUM), as Gloo does it: indices may coincide across ranks
    def sparse_of(r):
        return torch.sparse_coo_tensor(torch.tensor([[r % 4, 2], [0, (r + 1) % 4]]),
                                       torch.tensor([float(r + 1), 2.0]), (4, 4))
    sp = sparse_of(rank)
    dist.all_reduce(sp, group=lc)
    assert sp.is_sparse
    assert torch.equal(sp.to_dense(), sum(sparse_of(r).to_dense() for r in range(world)))
    # receives from any rank: every other rank sends its rank to rank 0, which learns the sender
    # from dist.recv's return value (and irecv's Work); each arrives once
    if rank == 0:
        seen = set()
        for i in range(world - 1):
            got = torch.empty(4, dtype=torch.int64)
            if i % 2 == 0:
                src = dist.recv(got, group=lc)
            else:
                w = dist.irecv(got, group=lc)
                w.wait()
                src = w._source_rank()
            assert torch.equal(got, torch.full((4,), src, dtype=torch.int64)), (src, got)
            seen.add(src)
        assert seen == set(range(1, world)), seen
    else:
        dist.send(torch.full((4,), rank, dtype=torch.int64), dst=0, group=lc)
    lowcomm.torch.monitored_barrier(group=lc, timeout=datetime.timedelta(seconds=30))
    try:
        dist.monitored_barrier(group=lc, timeout=datetime.timedelta(seconds=30),
                               wait_all_ranks=True)
    except ValueError as e:  # torch before 2.15 lets only Gloo groups through its function
        assert "only implemented for GLOO" in str(e), e
    # batch_isend_irecv: a ring, every rank sends to the next and receives from the previous
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    send_t = torch.full((100,), float(rank))
    recv_t = torch.empty(100)
    ops = [dist.P2POp(dist.isend, send_t, nxt, group=lc),
           dist.P2POp(dist.irecv, recv_t, prv, group=lc)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(recv_t, torch.full((100,), float(prv))), recv_t[:4]
    x = torch.ones(1 << 16)
    work = dist.all_reduce(x, group=lc, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    work.wait()
    assert torch.equal(fut.wait(), torch.full((1 << 16,), 2.0 * world))
    # Once wait() has returned, the work's future is complete (torchft chains callbacks on it
    # right after wait() and expects them to run at once); asked for before or after.
    for i in range(200):
        y = torch.ones(256)
        work = dist.all_reduce(y, group=lc, async_op=True)
        early = work.get_future() if i % 2 else None
        work.wait()
        for f in (early, work.get_future()):
            assert f is None or f.done(), i
    dist.barrier(group=lc)


def worker(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        body(rank, world, lc)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_op_matches_gloo(world, tmp_path):
    run_world(worker, world, tmp_path)
