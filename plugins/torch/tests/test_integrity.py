"""Bits flipped in received payload bytes through torch.distributed: one rank's recv(2) is
interposed (LD_PRELOAD of the core build's liblowcomm_recv_bitflip.so, tests/tools/) and flips
one bit in a fraction of its payload reads after the kernel delivered them. Every all-reduce
whose bytes were altered raises on that rank naming the peer and the checksum; no all-reduce
returns a wrong sum. Before payloads carried a check, the same injection gave silently wrong
results (35 of 180 all-reduces)."""
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

import lowcomm.torch  # noqa: F401

SHIM = pathlib.Path(__file__).resolve().parents[3] / "build" / "lib" / "liblowcomm_recv_bitflip.so"
WORLD = 3
FLIP_RANK = 2
OPS = 25
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
            shim.lowcomm_test_flip_configure(0.05, seed)  # after init: payloads only
        done = wrong = 0
        error = ""
        for op in range(OPS):
            x = value(rank, op)
            try:
                dist.all_reduce(x)
            except (RuntimeError, dist.DistBackendError) as e:
                error = str(e)
                break
            done += 1
            want = sum(value(q, op) for q in range(WORLD))
            if not torch.equal(x, want):
                wrong += 1
        flips = int(shim.lowcomm_test_flip_count()) if shim is not None else 0
        results.put((rank, done, wrong, flips, error[:400]))
        results.close()
        results.join_thread()
        os._exit(0)
    except Exception:  # noqa: BLE001
        results.put((rank, -1, -1, -1, traceback.format_exc()))
        results.close()
        results.join_thread()
        sys.exit(1)


@pytest.mark.skipif(not SHIM.exists(), reason=f"the core build's fault injector is missing: {SHIM}")
def test_flipped_payload_bits_raise_and_no_result_is_wrong(tmp_path):
    ctx = mp.get_context("spawn")
    flipped_runs = total_flips = correct = 0
    for trial in range(3):
        results = ctx.Queue()
        procs = []
        for r in range(WORLD):
            env_before = os.environ.get("LD_PRELOAD")
            if r == FLIP_RANK:
                os.environ["LD_PRELOAD"] = str(SHIM)
            try:
                p = ctx.Process(target=worker,
                                args=(r, str(tmp_path / f"init{trial}"), 77 + trial, results))
                p.start()
            finally:
                if env_before is None:
                    os.environ.pop("LD_PRELOAD", None)
                else:
                    os.environ["LD_PRELOAD"] = env_before
            procs.append(p)
        got = {}
        for _ in range(WORLD):
            rank, done, wrong, flips, error = results.get(timeout=180)
            got[rank] = (done, wrong, flips, error)
        for p in procs:
            p.join(timeout=60)
        for rank, (done, wrong, flips, error) in got.items():
            assert done >= 0, error
            assert wrong == 0, f"rank {rank} returned a wrong sum"
            correct += done
        done, _, flips, error = got[FLIP_RANK]
        total_flips += flips
        if flips:
            flipped_runs += 1
            assert done < OPS, "flipped bytes were used"
            assert "checksum" in error and "peer rank" in error, error
    assert flipped_runs >= 2
    print(f"torch: {total_flips} flips in {flipped_runs} runs, all detected; "
          f"{correct} correct all-reduces, 0 wrong")
