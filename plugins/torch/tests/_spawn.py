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

For a hang on a machine one cannot log into (scripts/gpu_check.sh's torch stage), two
variables: LOWCOMM_TEST_SPAWN_TIMEOUT_S caps every world's timeout, so one hung test fails and
the next one runs; LOWCOMM_TEST_STACKS_DIR names a folder where a rank still running at its
timeout leaves its Python stacks (faulthandler, every thread) and, where `cuda-gdb` (or `gdb`)
attaches, its native stacks, in stacks-<pid>.txt, before it is killed.
"""
import faulthandler
import functools
import os
import shutil
import signal
import subprocess
import sys
import time

import torch.multiprocessing as mp


def _then_exit(target, *args):
    stacks = os.environ.get("LOWCOMM_TEST_STACKS_DIR")
    if stacks:
        # SIGUSR1 (sent by run_procs at the timeout) writes every thread's Python stack.
        f = open(os.path.join(stacks, f"stacks-{os.getpid()}.txt"), "a")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
    target(*args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_procs(target, world, args, timeout=240, ctx=None):
    """target(rank, world, *args) in `world` spawned processes; their exit codes (a process still
    running after `timeout` is killed)."""
    ctx = ctx or mp.get_context("spawn")
    cap = os.environ.get("LOWCOMM_TEST_SPAWN_TIMEOUT_S")
    if cap:
        timeout = min(timeout, float(cap))
    procs = [ctx.Process(target=target, args=(r, world, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for p in procs:
        if p.is_alive():
            _leave_stacks(p.pid)
            p.kill()
            p.join()
    return [p.exitcode for p in procs]


def _leave_stacks(pid):
    """A rank still running at its timeout: its stacks into LOWCOMM_TEST_STACKS_DIR, if set."""
    stacks = os.environ.get("LOWCOMM_TEST_STACKS_DIR")
    if not stacks:
        return
    path = os.path.join(stacks, f"stacks-{pid}.txt")
    try:
        os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
    except OSError:
        pass
    debugger = shutil.which("cuda-gdb") or shutil.which("gdb")
    if debugger is None:
        return
    with open(path, "a") as f:
        f.write(f"\n== {debugger} -p {pid}: every thread's native stack\n")
        f.flush()
        try:
            subprocess.run([debugger, "-p", str(pid), "-batch", "-ex", "info threads",
                            "-ex", "thread apply all bt 20"], stdout=f, stderr=subprocess.STDOUT,
                           timeout=25, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            f.write(f"{debugger} failed: {e}\n")


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
