"""Runs one training run's ranks as spawned processes and collects what each puts on a queue,
failing at once (naming the rank and its exit code) if one dies instead of waiting forever."""
import queue as queue_module
import socket
import time

import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(target, n, args, timeout_s):
    """target(rank, *args, port, queue) in n processes; returns their results by rank."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, *args, port, queue)) for r in range(n)]
    for p in procs:
        p.start()
    results, deadline = [], time.monotonic() + timeout_s
    try:
        while len(results) < n:
            try:
                results.append(queue.get(timeout=1.0))
                continue
            except queue_module.Empty:
                pass
            dead = [(r, p.exitcode) for r, p in enumerate(procs)
                    if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"rank {dead[0][0]} exited with {dead[0][1]} (its traceback is "
                                 "above)")
            if time.monotonic() > deadline:
                raise SystemExit(f"no result within {timeout_s} s")
        for p in procs:
            p.join(timeout=60)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    return sorted(results, key=lambda r: r["rank"])
