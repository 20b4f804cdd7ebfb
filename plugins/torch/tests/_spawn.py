"""Runs `target(rank, world, init_file, errors)` in `world` spawned processes and fails the
calling test with every rank's traceback if any rank reported one or did not exit cleanly;
run_procs, the same without the checks, for tests that expect a rank to die.

run_world's ranks leave by os._exit(0) once `target` returns: their Gloo reference groups hit a
torch 2.11 bug otherwise. ProcessGroupGloo's worker thread destroys a completed work (and its
tensors) after waking the waiter; when the waiter's process is already finalizing Python, the
tensors' Python decref ends that thread by a forced unwind and the process aborts ("terminate
called without an active exception"; a core dump shows ProcessGroupGloo::runLoop ->
~AsyncAllgatherWork -> take_gil -> pthread_exit). 1 run in ~15 of test_coalesced.py. lowcomm's
own exit path (lowcomm.torch's atexit hook) is tested through a normal exit in test_shrink.py.
"""
import functools
import os
import sys

import torch.multiprocessing as mp


def _then_exit(target, *args):
    target(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_procs(target, world, args, timeout=240, ctx=None):
    """target(rank, world, *args) in `world` spawned processes; their exit codes (a process still
    running after `timeout` is killed)."""
    ctx = ctx or mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, world, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def run_world(target, world, tmp_path, timeout=240):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    codes = run_procs(functools.partial(_then_exit, target), world,
                      (str(tmp_path / "init"), errors), timeout, ctx)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert all(c == 0 for c in codes), codes
