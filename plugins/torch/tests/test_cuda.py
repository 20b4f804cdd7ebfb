"""CUDA tensors through lowcomm's torch backend and its Python layers (docs/torch.md, "CUDA
tensors"). Every test here needs a CUDA device and an extension built with CUDA, and is skipped
(by name, with the reason) without them; test_cuda_cpu.py has what runs without a GPU.

Two ranks share one GPU. Each rank runs every operation on CPU tensors and on CUDA tensors of
the same values, and the CUDA results must be the CPU results bit for bit (the library promises
the same bytes on both paths); a third pass mixes devices across ranks (rank 0 CUDA, rank 1 CPU).
"""
import sys
import time
import traceback

import pytest
import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA device (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(not lowcomm.torch.WITH_CUDA,
                       reason="lowcomm._C was built without CUDA (LOWCOMM_TORCH_CUDA=0, a torch "
                              "without CUDA, or no CUDA toolkit)"),
]

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
CODECS = ["q8", "q4", "q2", "minmax4"]


def vals(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float32) * 2).to(dtype)


def bits_equal(a, b, what):
    a, b = a.detach().cpu(), b.detach().cpu()
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    if a.dtype.is_floating_point:
        ok = torch.equal(a.view(torch.uint8 if a.element_size() == 1 else
                                {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]),
                         b.view(torch.uint8 if b.element_size() == 1 else
                                {2: torch.int16, 4: torch.int32, 8: torch.int64}[b.element_size()]))
    else:
        ok = torch.equal(a, b)
    assert ok, f"{what}: {a.flatten()[:6]} vs {b.flatten()[:6]}"


def _init(rank, world, init_file):
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    return dist.new_group(backend="lowcomm")


def _every_op(rank, world, lc, dev, tag):
    """Every op the backend takes, on tensors of `dev` (a device, or a function of the rank for
    mixed groups); returns {name: result on the CPU}."""
    out = {}
    d = dev
    R = dist.ReduceOp
    n = 3000 + 17
    for dtype in FLOATS:
        k = str(dtype).split(".")[-1]
        for op in (R.SUM, R.AVG, R.MAX):
            t = vals((n,), dtype, 10 + rank).to(d)
            dist.all_reduce(t, op=op, group=lc)
            out[f"all_reduce {k} {op}"] = t.cpu()
        for codec in CODECS:
            for ef in ("", f"{tag}/{k}/{codec}"):
                for step in range(3):
                    t = vals((n,), dtype, 100 * step + rank).to(d)
                    lowcomm.torch.all_reduce(t, op=R.AVG, codec=codec, error_feedback_key=ef,
                                             group=lc, step=step)
                    out[f"all_reduce {k} {codec} ef={bool(ef)} step {step}"] = t.cpu()
        # non-contiguous: a column of a matrix
        base = vals((257, 3), dtype, 20 + rank).to(d)
        col = base[:, 1]
        dist.all_reduce(col, group=lc)
        out[f"all_reduce {k} non-contiguous"] = base.cpu()
        inp = vals((world * 33,), dtype, 30 + rank).to(d)
        o = torch.empty(33, dtype=dtype, device=d)
        dist.reduce_scatter_tensor(o, inp, group=lc)
        out[f"reduce_scatter_tensor {k}"] = o.cpu()
        o = torch.empty(33, dtype=dtype, device=d)
        dist.reduce_scatter(o, list(inp.chunk(world)), group=lc)
        out[f"reduce_scatter {k}"] = o.cpu()
        x = vals((29,), dtype, 40 + rank).to(d)
        outs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(outs, x, group=lc)
        out[f"all_gather {k}"] = torch.cat([o.cpu() for o in outs])
        flat = torch.empty(world * 29, dtype=dtype, device=d)
        dist.all_gather_into_tensor(flat, x, group=lc)
        out[f"all_gather_into_tensor {k}"] = flat.cpu()
        for root in range(world):
            b = vals((41,), dtype, 50 + rank).to(d)
            dist.broadcast(b, src=root, group=lc)
            out[f"broadcast {k} {root}"] = b.cpu()
            r = vals((41,), dtype, 60 + rank).to(d)
            dist.reduce(r, dst=root, group=lc)
            if rank == root:
                out[f"reduce {k} {root}"] = r.cpu()
            g = [torch.empty(7, dtype=dtype, device=d) for _ in range(world)] \
                if rank == root else None
            dist.gather(vals((7,), dtype, 70 + rank).to(d), g, dst=root, group=lc)
            if rank == root:
                out[f"gather {k} {root}"] = torch.cat([t.cpu() for t in g])
            s = torch.empty(5, dtype=dtype, device=d)
            dist.scatter(s, [vals((5,), dtype, 80 + j).to(d) for j in range(world)]
                         if rank == root else None, src=root, group=lc)
            out[f"scatter {k} {root}"] = s.cpu()
        # all_to_all_single with uneven splits: rank r sends r + j + 1 rows to rank j
        send_splits = [rank + j + 1 for j in range(world)]
        recv_splits = [j + rank + 1 for j in range(world)]
        a_in = vals((sum(send_splits), 3), dtype, 90 + rank).to(d)
        a_out = torch.empty(sum(recv_splits), 3, dtype=dtype, device=d)
        dist.all_to_all_single(a_out, a_in, recv_splits, send_splits, group=lc)
        out[f"all_to_all_single {k}"] = a_out.cpu()
        ins = [vals((j + 2,), dtype, 95 + rank * 7 + j).to(d) for j in range(world)]
        outs = [torch.empty(rank + 2, dtype=dtype, device=d) for _ in range(world)]
        dist.all_to_all(outs, ins, group=lc)
        out[f"all_to_all {k}"] = torch.cat([t.cpu() for t in outs])
        # send/recv and batch_isend_irecv (a ring)
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        st = vals((100,), dtype, 110 + rank).to(d)
        rt = torch.empty(100, dtype=dtype, device=d)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, st, nxt, group=lc),
                                         dist.P2POp(dist.irecv, rt, prv, group=lc)]):
            w.wait()
        out[f"ring {k}"] = rt.cpu()
        if rank == 0:
            dist.send(st, dst=1, group=lc)
        elif rank == 1:
            dist.recv(rt, src=0, group=lc)
            out[f"send/recv {k}"] = rt.cpu()
    dist.barrier(group=lc)
    return out


def _ops_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        cpu = _every_op(rank, world, lc, torch.device("cpu"), "cpu")
        gpu = _every_op(rank, world, lc, torch.device("cuda", 0), "gpu")
        mixed = _every_op(rank, world, lc,
                          torch.device("cuda", 0) if rank == 0 else torch.device("cpu"), "mixed")
        assert cpu.keys() == gpu.keys() == mixed.keys()
        for name in cpu:
            bits_equal(gpu[name], cpu[name], f"{name} (CUDA vs CPU)")
            bits_equal(mixed[name], cpu[name], f"{name} (mixed group vs CPU)")
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_every_op_on_cuda_matches_cpu_bit_for_bit(tmp_path):
    run_world(_ops_worker, 2, tmp_path, timeout=600)


def _streams_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        n = 1 << 20
        for side in (False, True):  # the default stream, then a stream of the caller's own
            s = torch.cuda.Stream() if side else torch.cuda.current_stream()
            with torch.cuda.stream(s):
                x = torch.zeros(n, device="cuda")
                torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
                x.fill_(rank + 1.0)
                work = dist.all_reduce(x, group=lc, async_op=True)
                work.wait()
                y = x * 2  # queued after wait(): sees the sum
                assert torch.equal(y.cpu(), torch.full((n,), 2.0 * 3)), (side, y[:4])
                # compressed: the GPU encoder reads after the fill as well
                z = torch.zeros(n, device="cuda")
                torch.cuda._sleep(200_000_000)
                z.fill_(rank + 1.0)
                lowcomm.torch.all_reduce(z, codec="q8", group=lc)
                assert torch.allclose(z.cpu(), torch.full((n,), 3.0), rtol=0.02), (side, z[:4])
                # future: then() on a CUDA future runs with the results in place
                x.fill_(1.0)
                fut = dist.all_reduce(x, group=lc, async_op=True).get_future()
                assert torch.equal(fut.then(lambda f: f.value()[0] + 1).wait().cpu(),
                                   torch.full((n,), 3.0))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_collectives_follow_the_current_stream(tmp_path):
    run_world(_streams_worker, 2, tmp_path)


def _wait_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        x = torch.ones(4 << 20, device="cuda")  # 16 MiB over 100 Mbit/s: > 1 s
        dist.all_reduce(torch.ones(8, device="cuda"), group=lc)  # connections warm
        torch.cuda.synchronize()
        work = dist.all_reduce(x, group=lc, async_op=True)
        t0 = time.perf_counter()
        queued = work.is_completed()
        work.wait()  # Gloo's semantics: the host waits for the operation
        waited = time.perf_counter() - t0
        assert not queued, "the operation completed before any WAN time passed"
        assert waited > 0.5, f"wait() returned after {waited:.3f} s: no WAN emulation?"
        assert work.is_completed()
        # the caller's stream, then the host, see the result (a pageable copy while nothing
        # holds a stream on the host: the shape that deadlocked with a device-side wait)
        y = x + 1
        assert torch.equal(y.cpu(), torch.full_like(x, 3.0).cpu())
        assert x.sum().item() == 2.0 * (4 << 20)
        # synchronize() blocks the host until the results are in place
        x.fill_(1.0)
        work = dist.all_reduce(x, group=lc, async_op=True)
        work.synchronize()
        assert work.is_completed()
        assert torch.equal(x.cpu(), torch.full((4 << 20,), 2.0))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_wait_blocks_the_host_until_the_results_are_in_place(tmp_path, monkeypatch):
    monkeypatch.setenv("LOWCOMM_WAN", "bw=100mbit,rtt=20ms")
    run_world(_wait_worker, 2, tmp_path)


def _bytes_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        n = 1 << 22
        for codec in ("q4", "q2", "q8"):
            x = vals((n,), torch.float32, rank).cuda()
            lowcomm.torch.all_reduce(x, op=dist.ReduceOp.AVG, codec=codec, group=lc)
            st = lowcomm.torch.last_op_stats(lc)
            encoded = lowcomm._C.encoded_size(codec, n)
            assert st["device_path"] == "gpu-codec", st
            # only encoded bytes cross PCIe: the contributions' codes out, the results' codes
            # in, each the encoded size of the tensor (docs/collectives.md, "CUDA buffers")
            for way in ("device_to_host_bytes", "host_to_device_bytes"):
                assert abs(st[way] - encoded) <= encoded // 100 + 4096, (codec, way, st, encoded)
        x = torch.ones(n, device="cuda")
        dist.all_reduce(x, group=lc)  # exact: staged through pinned host memory
        st = lowcomm.torch.last_op_stats(lc)
        assert st["device_path"] == "staged" and st["device_to_host_bytes"] >= 4 * n, st
        dist.all_reduce(torch.ones(n), group=lc)
        st = lowcomm.torch.last_op_stats(lc)
        assert st["device_path"] == "" and st["device_to_host_bytes"] == 0, st
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_compressed_all_reduce_moves_only_encoded_bytes_across_pcie(tmp_path):
    run_world(_bytes_worker, 2, tmp_path)


def _allocator_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        n = 1 << 22
        x = vals((n,), torch.float32, rank).cuda()
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        lowcomm.torch.all_reduce(x, codec="q4", error_feedback_key="g", group=lc)
        st = lowcomm.torch.last_op_stats(lc)
        assert st["device_path"] == "gpu-codec", st
        # the residual (n fp32) stays on the device, in torch's caching allocator's accounting
        # (docs/torch.md, "Device memory")
        kept = torch.cuda.memory_allocated() - before
        assert kept >= 4 * n, (kept, 4 * n)
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_library_device_memory_is_in_torchs_accounting(tmp_path):
    run_world(_allocator_worker, 2, tmp_path)


def _refusals_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        x = torch.ones(1024, device="cuda")
        dist.all_reduce(x, group=lc)  # warm: capture must not be the first use
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g):
                dist.all_reduce(x, group=lc)
            raise AssertionError("a captured all_reduce was not refused")
        except RuntimeError as e:  # ours, or the graph's end after it (then ours is its context)
            said = f"{e} {e.__context__}"
            assert "cannot be captured in a CUDA graph" in said, said
        torch.cuda.synchronize()
        # one operation, two devices
        try:
            dist.all_gather_into_tensor(torch.empty(2048), x, group=lc)
            raise AssertionError("mixed devices in one operation were not refused")
        except RuntimeError as e:  # ours ("one device"), or torch's own check first
            assert "device" in str(e), e
        dist.all_reduce(x, group=lc)  # the group still works
        assert float(x[0].item()) == 4.0
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_capture_and_mixed_devices_are_refused(tmp_path):
    run_world(_refusals_worker, 2, tmp_path)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("codec", CODECS + ["q4:block=64", "q8:col=32"])
def test_codec_bindings_on_cuda_write_the_cpu_bytes(codec, dtype):
    from lowcomm import _C
    n = 64 * 97
    x = vals((n,), dtype, 1)
    codes = _C.encode(codec, x, seed=3, offset=5)
    codes_gpu = _C.encode(codec, x.cuda(), seed=3, offset=5)
    assert codes_gpu.is_cuda
    bits_equal(codes_gpu, codes, "encode")
    out, out_gpu = torch.empty_like(x), torch.empty_like(x).cuda()
    _C.decode(codec, codes, out)
    _C.decode(codec, codes_gpu, out_gpu)
    bits_equal(out_gpu, out, "decode")
    m, m_gpu = vals((n,), dtype, 2), vals((n,), dtype, 2).cuda()
    c = _C.encode_delta(codec, x, m)
    c_gpu = _C.encode_delta(codec, x.cuda(), m_gpu)
    bits_equal(c_gpu, c, "encode_delta codes")
    bits_equal(m_gpu, m, "encode_delta cache")
    r, r_gpu = vals((n,), dtype, 4), vals((n,), dtype, 4).cuda()
    o, o_gpu = torch.empty_like(r), torch.empty_like(r_gpu)
    _C.decode_delta(codec, c, r, o)
    _C.decode_delta(codec, c_gpu, r_gpu, o_gpu)
    bits_equal(r_gpu, r, "decode_delta cache")
    bits_equal(o_gpu, o, "decode_delta out")
    with pytest.raises(ValueError, match="one device"):
        _C.decode(codec, codes, out_gpu)


def _diloco_run(rank, lc, device, **kw):
    from lowcomm.diloco import DiLoCo
    lowcomm.torch.reset_error_feedback(lc)  # each run from zero residuals (the same names)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).to(device)
    outer = DiLoCo(model, group=lc, sync_every=3, **kw)
    g = torch.Generator().manual_seed(100 + rank)
    with torch.no_grad():
        for _ in range(9):
            for p in model.parameters():  # an inner step that rounds alike on CPU and GPU
                p.sub_(torch.randn(p.shape, generator=g).mul_(0.01).to(device))
            outer.step()
    outer.finish()
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def _diloco_worker(rank, world, init_file, errors):
    try:
        lc = _init(rank, world, init_file)
        # outer SGD without momentum at lr 1: θ_g − Δ̄ is exact, so the bits are lowcomm's
        exact = dict(outer_lr=1.0, outer_momentum=0.0, nesterov=False)
        for kw in (dict(exact), dict(exact, codec="q4", error_feedback=True, name="a"),
                   dict(exact, codec="q2", overlap=True, name="b"),
                   dict(exact, codec="q4", fragments=2, delay=1, name="c")):
            cpu = _diloco_run(rank, lc, "cpu", **kw)
            gpu = _diloco_run(rank, lc, "cuda", **kw)
            bits_equal(gpu, cpu, f"DiLoCo {kw}")
        # the default Nesterov outer step: every replica identical, close to the CPU run
        gpu = _diloco_run(rank, lc, "cuda", codec="q4", name="d")
        cpu = _diloco_run(rank, lc, "cpu", codec="q4", name="e")
        both = [torch.empty_like(gpu) for _ in range(world)]
        dist.all_gather(both, gpu)
        bits_equal(both[0], both[1], "DiLoCo replicas on CUDA")
        # torch's Nesterov step may round differently on the GPU; a flipped code then moves a
        # value by about one quantization step
        assert (gpu - cpu).abs().max() < 1e-2, (gpu - cpu).abs().max()
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_diloco_on_cuda_matches_cpu(tmp_path):
    run_world(_diloco_worker, 2, tmp_path, timeout=600)


def _aqsgd_worker(rank, world, init_file, errors):
    try:
        from lowcomm.aqsgd import Link
        lc = _init(rank, world, init_file)
        shape = (16, 64)
        results = {}
        for name, dev, kw in (("cpu", "cpu", {}), ("cuda", "cuda", {}),
                              ("mixed", "cuda" if rank == 0 else "cpu", {}),
                              ("cpu-rot", "cpu", {"rotate": True}),
                              ("cuda-rot", "cuda", {"rotate": True}),
                              ("cpu-ch", "cpu", {"scales": "channel"}),
                              ("cuda-ch", "cuda", {"scales": "channel"})):
            link = Link(1 - rank, shape, group=lc, bits=2, block=64, device=dev, **kw)
            got = []
            g = torch.Generator().manual_seed(7)
            for step in range(6):
                ids = [(step * 3 + i) % 8 for i in range(4)]
                x = torch.randn(4, *shape, generator=g)
                if rank == 0:
                    link.send(x.to(dev), ids)
                    got.append(link.recv_grad(ids).cpu())
                else:
                    h = link.recv(ids)
                    assert h.device.type == torch.device(dev).type
                    got.append(h.cpu())
                    link.send_grad(h * 0.5, ids)
            link.flush()
            link.verify()
            results[name] = torch.stack(got)
        bits_equal(results["cuda"], results["cpu"], "AQ-SGD CUDA vs CPU")
        bits_equal(results["mixed"], results["cpu"], "AQ-SGD mixed vs CPU")
        bits_equal(results["cuda-rot"], results["cpu-rot"], "AQ-SGD rotated CUDA vs CPU")
        bits_equal(results["cuda-ch"], results["cpu-ch"], "AQ-SGD channel scales CUDA vs CPU")
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        errors.put(f"rank {rank}: {traceback.format_exc()}")
        sys.exit(1)


def test_aqsgd_on_cuda_matches_cpu(tmp_path):
    run_world(_aqsgd_worker, 2, tmp_path)


def _elastic_worker(rank, world, store_path, out):
    from lowcomm.elastic import ElasticGroup
    torch.cuda.set_device(0)
    store = dist.FileStore(store_path, -1)
    g = ElasticGroup.init(store, rank, world, bind="127.0.0.1", retries=0, failure_timeout=3.0)
    state = torch.full((10,), 5.0, device="cuda")
    g.register_state("s", state)
    res = []
    for dev in ("cpu", "cuda"):
        t = vals((1000,), torch.float32, rank).to(dev)
        g.all_reduce(t, average=True, codec="q4")
        res.append(t.cpu())
        b = vals((10,), torch.float32, 10 + rank).to(dev)
        g.broadcast(b, 0)
        res.append(b.cpu())
        gathered, _ = g.all_gather(vals((3,), torch.float32, 20 + rank).to(dev))
        assert gathered.device.type == dev
        res.append(gathered.cpu().reshape(-1))
    state.add_(1.0)  # changes between collectives, alike on every member
    t = torch.ones(4, device="cuda")
    g.all_reduce(t)
    torch.save([r.clone() for r in res] + [state.cpu()], f"{out}.{rank}")


def test_elastic_group_takes_cuda_tensors(tmp_path):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_elastic_worker, args=(r, 2, str(tmp_path / "store"),
                                                       str(tmp_path / "out")))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
    assert [p.exitcode for p in procs] == [0, 0]
    for rank in range(2):
        res = torch.load(f"{tmp_path / 'out'}.{rank}")
        for cpu, gpu in ((res[0], res[3]), (res[1], res[4]), (res[2], res[5])):
            bits_equal(gpu, cpu, "elastic CUDA vs CPU")
        assert torch.equal(res[6], torch.full((10,), 6.0))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"] + sys.argv[1:]))
