"""Failures through torch.distributed are exceptions within seconds, never hangs: a peer that
dies, a peer that freezes (SIGSTOP), a peer that never calls (the group's timeout is every operation's deadline), mismatched
collectives, a monitored barrier a rank misses, and abort(); getError() says what broke, and a
broken group fails every later op at once."""
import datetime
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lowcomm.torch


def put(results, item):
    # Flushed before os._exit, which would drop what the queue's feeder thread has not sent.
    results.put(item)
    results.close()
    results.join_thread()


def worker(rank, world, init_file, mode, results):
    try:
        # "frozen": a long deadline, so that only the silence can end the wait in time
        deadline = 60 if mode == "frozen" else 3
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=deadline))
        x = torch.ones(1 << 20)
        dist.all_reduce(x)  # everyone healthy first
        if rank == 1:
            if mode == "killed":
                os._exit(3)  # dies without a word, as a crash or an OOM kill
            if mode == "frozen":  # SIGSTOP: its sockets stay open, nothing it sends says why
                with open(init_file + ".frozen", "w") as f:
                    f.write(str(os.getpid()))
                os.kill(os.getpid(), signal.SIGSTOP)
                os._exit(0)  # not reached: rank 0 kills it
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
        if mode == "frozen":
            with open(init_file + ".frozen") as f:
                os.kill(int(f.read()), signal.SIGKILL)
        os._exit(0)
    except Exception:  # noqa: BLE001
        put(results, (rank, traceback.format_exc(), -1.0))
        sys.exit(1)


def raised(fn):
    """(text of the exception fn raised, or "no exception", seconds it took)."""
    t0 = time.monotonic()
    try:
        fn()
        return "no exception", time.monotonic() - t0
    except dist.DistBackendError as e:
        return f"DistBackendError: {e}", time.monotonic() - t0
    except RuntimeError as e:
        return f"RuntimeError: {e}", time.monotonic() - t0


def broken_worker(rank, world, init_file, mode, results):
    """Modes whose failure every rank sees; each rank reports what it saw."""
    try:
        if mode == "mismatch_detail":
            # torch wraps every registered backend in its ProcessGroupWrapper, which checks each
            # collective's fingerprint over a Gloo side group before running it
            os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
            dist.set_debug_level_from_env()
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=20))
        pg = dist.group.WORLD
        x = torch.ones(1000)
        dist.all_reduce(x)
        report = {}
        if mode in ("mismatch", "mismatch_detail"):
            y = torch.ones(100 if rank == 0 else 200)
            report["first"] = raised(lambda: dist.all_reduce(y))
        elif mode in ("monitor", "monitor_all"):
            lowcomm.torch.monitored_barrier(timeout=datetime.timedelta(seconds=10))  # all come
            late = {1, 2} if mode == "monitor_all" else {2}
            if rank in late:
                time.sleep(4)
            else:
                report["first"] = raised(lambda: lowcomm.torch.monitored_barrier(
                    timeout=datetime.timedelta(seconds=1), wait_all_ranks=mode == "monitor_all"))
        elif mode == "abort":
            if rank == 0:
                work = dist.all_reduce(x, async_op=True)  # rank 1 never joins it
                time.sleep(0.3)
                assert lowcomm.torch.get_error() == "SUCCESS"
                pg.abort()
                report["first"] = raised(lambda: work.wait())
            else:
                time.sleep(2)
        report["error_type"] = lowcomm.torch.get_error()
        backend = pg._get_backend(torch.device("cpu"))
        if hasattr(backend, "get_error"):  # torch's own binding (2.15)
            assert backend.get_error().name == report["error_type"], backend.get_error()
        report["later"] = raised(lambda: dist.all_reduce(torch.ones(10)))
        put(results, (rank, report))
        os._exit(0)
    except Exception:  # noqa: BLE001
        put(results, (rank, {"traceback": traceback.format_exc()}))
        sys.exit(1)


def run(mode, tmp_path, world=2, target=worker):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, str(tmp_path / "init"), mode, results))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    for p in procs:
        if p.is_alive():
            p.kill()
    out = {}
    while not results.empty():
        rank, *rest = results.get()
        out[rank] = tuple(rest) if len(rest) > 1 else rest[0]
    return out


def test_killed_peer_raises_within_seconds(tmp_path):
    out = run("killed", tmp_path)
    text, took = out[0]
    assert text.startswith("DistBackendError") and "rank 1" in text, text
    assert 0 <= took < 5, took


def test_frozen_peer_raises_within_seconds_not_at_the_deadline(tmp_path):
    # The default failure timeout (1500 ms): the peer's silence, not the 60 s deadline, ends it.
    out = run("frozen", tmp_path)
    text, took = out[0]
    assert text.startswith("DistBackendError") and "rank 1" in text, text
    assert "frozen or cut off" in text, text
    assert 1 <= took < 5, took


def test_deadline_raises_naming_the_rank_that_never_started(tmp_path):
    out = run("deadline", tmp_path)
    text, took = out[0]
    assert text.startswith("DistBackendError") and "rank 1 has not started" in text, text
    assert 2 <= took < 8, took


def test_mismatched_collective_raises_on_every_rank_and_breaks_the_group(tmp_path):
    out = run("mismatch", tmp_path, target=broken_worker)
    for rank in (0, 1):
        assert "traceback" not in out[rank], out[rank]
        text, took = out[rank]["first"]
        assert text.startswith("DistBackendError") and "mismatched operations" in text, text
        assert "count 100" in text and "count 200" in text, text
        assert took < 5, took
        assert out[rank]["error_type"] in ("COMM_ERROR", "REMOTE_ERROR"), out[rank]
        later, took = out[rank]["later"]
        assert later.startswith("DistBackendError") and "failed earlier" in later, later
        assert took < 0.5, took


def test_torch_distributed_debug_detail_wraps_the_backend(tmp_path):
    out = run("mismatch_detail", tmp_path, target=broken_worker)
    for rank in (0, 1):
        assert "traceback" not in out[rank], out[rank]
        text, took = out[rank]["first"]
        # the wrapper's account: both ranks' collectives, with their tensor shapes
        assert "Detected mismatch between collectives on ranks" in text, text
        assert "[100]" in text and "[200]" in text, text
        assert took < 5, took


def test_monitored_barrier_names_the_rank_that_did_not_come(tmp_path):
    out = run("monitor", tmp_path, world=3, target=broken_worker)
    assert "traceback" not in out[0], out[0]
    text, took = out[0]["first"]
    assert "Rank 2 failed to pass monitoredBarrier in 1000 ms" in text, text
    assert 0.9 < took < 4, took
    assert out[0]["later"][0].startswith("DistBackendError"), out[0]["later"]
    # rank 1 came, and learns that rank 0 failed instead of waiting for its release
    text, took = out[1]["first"]
    assert "received errors while waiting for send/recv from rank 0" in text, text


def test_monitored_barrier_wait_all_ranks_names_every_missing_rank(tmp_path):
    out = run("monitor_all", tmp_path, world=3, target=broken_worker)
    text, took = out[0]["first"]
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in text, text


def test_abort_fails_work_in_flight_at_once(tmp_path):
    out = run("abort", tmp_path, target=broken_worker)
    assert "traceback" not in out[0], out[0]
    text, took = out[0]["first"]
    assert text.startswith("DistBackendError") and "abort" in text.lower(), text
    assert took < 0.5, took
    assert out[0]["error_type"] == "COMM_ERROR", out[0]
    later, took = out[0]["later"]
    assert later.startswith("DistBackendError") and took < 0.5, (later, took)
