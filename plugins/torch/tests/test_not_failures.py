"""Things that are not faults do not end a job (Gloo survives each of them too): a rank paused
(SIGSTOP ... SIGCONT: a scheduler's suspend, a VM stun, a debugger) while the group is idle, and
a future callback that calls a collective (`fut.then(lambda _: dist.all_reduce(y))`) or waits on
a later operation."""
import datetime
import os
import signal
import sys
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import lowcomm.torch  # noqa: F401  (registers the backend)
from _spawn import run_procs


def put(results, item):
    results.put(item)
    results.close()
    results.join_thread()


def stopped(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"
    except OSError:
        return False


def wait_for_file(path, timeout):
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(path)
        time.sleep(0.005)


def paused_worker(rank, world, init_file, pause_s, results):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        x = torch.ones(1 << 18)
        dist.all_reduce(x)
        go = init_file + ".go"
        if rank == 1:
            with open(init_file + ".pid.tmp", "w") as f:
                f.write(str(os.getpid()))
            os.rename(init_file + ".pid.tmp", init_file + ".pid")
            os.kill(os.getpid(), signal.SIGSTOP)  # rank 0 resumes it
        elif rank == 0:
            wait_for_file(init_file + ".pid", 30)
            with open(init_file + ".pid") as f:
                pid = int(f.read())
            t0 = time.monotonic()
            while not stopped(pid):
                assert time.monotonic() - t0 < 30, "rank 1 did not stop"
                time.sleep(0.001)
            time.sleep(pause_s)
            open(go, "w").close()
            os.kill(pid, signal.SIGCONT)
        wait_for_file(go, 30 + pause_s)
        y = torch.full((1 << 18,), float(rank + 1))
        dist.all_reduce(y)
        want = world * (world + 1) / 2
        put(results, (rank, "ok" if bool((y == want).all()) else f"sum {y[0].item()}"))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        put(results, (rank, traceback.format_exc()))
        sys.exit(1)


def callback_worker(rank, world, init_file, n, results):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=30))
        x = torch.ones(n)
        y = torch.full((n,), 2.0)
        # A collective issued inside a callback, waited for there (async_op=False).
        fut = dist.all_reduce(x, async_op=True).get_future()
        chained = fut.then(lambda _: dist.all_reduce(y))
        chained.wait()
        assert bool((x == world).all()) and bool((y == 2 * world).all()), (x[0], y[0])
        # A wait inside a callback on an operation issued after the one whose future it is.
        z = torch.full((n,), 3.0)
        w1 = dist.all_reduce(x, async_op=True)
        later = dist.all_reduce(z, async_op=True)
        done = w1.get_future().then(lambda _: later.wait())
        done.wait()
        assert bool((z == 3 * world).all()), z[0]
        # DDP-style: a hook's future whose callback issues the next bucket's all-reduce and
        # waits for its future (which completes only once the executor has run it).
        buckets = [torch.full((n,), float(i)) for i in range(3)]

        def chain(i):
            f = dist.all_reduce(buckets[i], async_op=True).get_future()
            return f if i + 1 == len(buckets) else f.then(lambda _: chain(i + 1).wait())

        chain(0).wait()
        for i, b in enumerate(buckets):
            assert bool((b == i * world).all()), (i, b[0])
        put(results, (rank, "ok"))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        put(results, (rank, traceback.format_exc()))
        sys.exit(1)


def run(target, tmp_path, world, arg, timeout):
    """Each rank's reported text by rank, and the exit codes (run_procs: the spawn timeout cap
    and the stacks of a rank still running at its timeout apply)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    codes = run_procs(target, world, (str(tmp_path / "init"), arg, results), timeout, ctx)
    out = {}
    while not results.empty():
        rank, text = results.get()
        out[rank] = text
    return out, codes


def test_rank_paused_ten_seconds_while_idle_is_not_failed(tmp_path):
    # The default failure timeout (1500 ms): the pause is almost seven of them.
    out, codes = run(paused_worker, tmp_path, 3, 10.0, timeout=90)
    assert out == {0: "ok", 1: "ok", 2: "ok"}, (out, codes)


def test_future_callbacks_may_call_collectives(tmp_path):
    for i, n in enumerate((1 << 18, 16)):  # the executor's thread; small ones run inline
        d = tmp_path / str(i)
        d.mkdir()
        out, codes = run(callback_worker, d, 3, n, timeout=60)
        assert out == {0: "ok", 1: "ok", 2: "ok"}, (n, out, codes)
