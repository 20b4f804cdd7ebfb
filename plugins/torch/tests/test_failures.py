"""Failures through torch.distributed are exceptions within seconds, never hangs: a peer that
dies, and a peer that never calls (the group's timeout is every operation's deadline)."""
import datetime
import os
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lowcomm.torch  # noqa: F401


def put(results, item):
    # Flushed before os._exit, which would drop what the queue's feeder thread has not sent.
    results.put(item)
    results.close()
    results.join_thread()


def worker(rank, world, init_file, mode, results):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=3))
        x = torch.ones(1 << 20)
        dist.all_reduce(x)  # everyone healthy first
        if rank == 1:
            if mode == "killed":
                os._exit(3)  # dies without a word, as a crash or an OOM kill
            time.sleep(8)  # "deadline": never calls the next operation
            put(results, (rank, "slept", 0.0))
            os._exit(0)
        t0 = time.monotonic()
        try:
            dist.all_reduce(x)
            put(results, (rank, "no exception", time.monotonic() - t0))
        except dist.DistBackendError as e:
            put(results, (rank, f"DistBackendError: {e}", time.monotonic() - t0))
        except RuntimeError as e:
            put(results, (rank, f"RuntimeError: {e}", time.monotonic() - t0))
        os._exit(0)
    except Exception:  # noqa: BLE001
        put(results, (rank, traceback.format_exc(), -1.0))
        sys.exit(1)


def run(mode, tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, 2, str(tmp_path / "init"), mode, results))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    for p in procs:
        if p.is_alive():
            p.kill()
    out = {}
    while not results.empty():
        rank, text, took = results.get()
        out[rank] = (text, took)
    return out


def test_killed_peer_raises_within_seconds(tmp_path):
    out = run("killed", tmp_path)
    text, took = out[0]
    assert text.startswith("DistBackendError") and "rank 1" in text, text
    assert 0 <= took < 5, took


def test_deadline_raises_naming_the_rank_that_never_started(tmp_path):
    out = run("deadline", tmp_path)
    text, took = out[0]
    assert text.startswith("DistBackendError") and "rank 1 has not started" in text, text
    assert 2 <= took < 8, took
