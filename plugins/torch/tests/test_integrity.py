"""Bits flipped in received payload bytes through torch.distributed: one rank's recv(2) is
interposed (LD_PRELOAD of the core build's liblowcomm_recv_bitflip.so, tests/tools/) and flips
one bit in 1% of its payload reads after the kernel delivered them. Every altered chunk fails
its check and is sent again (docs/transport.md, "Re-sends"): all 200 all-reduces succeed, none
returns a wrong sum, and last_op_stats() counts the re-sent chunks, one per flip. Before payloads
carried a check, the same injection gave silently wrong results (35 of 180 all-reduces); before
re-sends, an altered all-reduce raised and the group was done."""
import ctypes
import datetime
import os
import pathlib
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lowcomm.torch

SHIM = pathlib.Path(__file__).resolve().parents[3] / "build" / "lib" / "liblowcomm_recv_bitflip.so"
WORLD = 3
FLIP_RANK = 2
OPS = 200
N = 1 << 18  # fp32 elements, 1 MiB


def value(rank, op):
    i = torch.arange(N, dtype=torch.int64)
    return ((i * 7 + rank * 13 + op * 5) % 97 - 48).to(torch.float32)


def worker(rank, init_file, seed, results):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=WORLD, timeout=datetime.timedelta(seconds=20))
        shim = ctypes.CDLL(None) if rank == FLIP_RANK else None
        if shim is not None:
            shim.lowcomm_test_flip_configure.argtypes = [ctypes.c_double, ctypes.c_uint64]
            shim.lowcomm_test_flip_count.restype = ctypes.c_uint64
            shim.lowcomm_test_flip_configure(0.01, seed)  # after init: payloads only
        done = wrong = resent = 0
        error = ""
        for op in range(OPS):
            x = value(rank, op)
            try:
                dist.all_reduce(x)
            except (RuntimeError, dist.DistBackendError) as e:
                error = str(e)
                break
            done += 1
            resent += lowcomm.torch.last_op_stats()["chunks_resent"]
            want = sum(value(q, op) for q in range(WORLD))
            if not torch.equal(x, want):
                wrong += 1
        flips = int(shim.lowcomm_test_flip_count()) if shim is not None else 0
        results.put((rank, done, wrong, flips, resent, error[:400]))
        results.close()
        results.join_thread()
        os._exit(0)
    except Exception:  # noqa: BLE001
        results.put((rank, -1, -1, -1, -1, traceback.format_exc()))
        results.close()
        results.join_thread()
        sys.exit(1)


@pytest.mark.skipif(not SHIM.exists(), reason=f"the core build's fault injector is missing: {SHIM}")
def test_flipped_payload_bits_are_sent_again_and_every_result_is_exact(tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = []
    for r in range(WORLD):
        env_before = os.environ.get("LD_PRELOAD")
        if r == FLIP_RANK:
            os.environ["LD_PRELOAD"] = str(SHIM)
        try:
            p = ctx.Process(target=worker, args=(r, str(tmp_path / "init"), 77, results))
            p.start()
        finally:
            if env_before is None:
                os.environ.pop("LD_PRELOAD", None)
            else:
                os.environ["LD_PRELOAD"] = env_before
        procs.append(p)
    got = {}
    for _ in range(WORLD):
        rank, done, wrong, flips, resent, error = results.get(timeout=300)
        got[rank] = (done, wrong, flips, resent, error)
    for p in procs:
        p.join(timeout=60)
    for rank, (done, wrong, flips, resent, error) in got.items():
        assert done == OPS, f"rank {rank} failed after {done} all-reduces: {error}"
        assert wrong == 0, f"rank {rank} returned a wrong sum"
        if rank != FLIP_RANK:
            assert resent == 0, (rank, resent)
    _, _, flips, resent, _ = got[FLIP_RANK]
    assert flips > 10, flips
    assert resent == flips, f"{flips} flips but {resent} chunks re-sent"
    print(f"torch: {flips} flips in {OPS} all-reduces, {resent} chunks re-sent, 0 failed, 0 wrong")
