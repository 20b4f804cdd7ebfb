"""Runs `target(rank, world, init_file, errors)` in `world` spawned processes and fails the
calling test with every rank's traceback if any rank reported one or did not exit cleanly."""
import torch.multiprocessing as mp


def run_world(target, world, tmp_path, timeout=240):
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, str(tmp_path / "init"), errors))
             for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
