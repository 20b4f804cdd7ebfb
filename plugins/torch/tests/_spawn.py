"""Runs `target(rank, world, init_file, errors)` in `world` spawned processes and fails the
calling test with every rank's traceback if any rank reported one or did not exit cleanly;
run_procs, the same without the checks, for tests that expect a rank to die."""
import torch.multiprocessing as mp


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
    codes = run_procs(target, world, (str(tmp_path / "init"), errors), timeout, ctx)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert all(c == 0 for c in codes), codes
