"""Compute-utilisation meter: how much of the wall time a worker spent computing.

Low-communication training is judged by how little it waits: DiLoCo workers stall at the
outer synchronisation, pipeline stages stall waiting for activations. Wrap the compute (forward,
backward, optimizer step) in ``with meter.compute():``; ``utilisation()`` is the compute time
divided by the wall time since the meter started, so 1.0 means never waiting. ``add_bytes``
counts what the worker sent, so a run can report bytes per step next to its utilisation.

Nested ``compute()`` blocks count once (only the outermost is timed). Timing is host time: a
caller computing on a GPU must synchronise before the block ends for the number to mean
anything.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator


class Meter:
    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        """Restarts the wall clock and zeroes compute time and bytes."""
        self._start = self._clock()
        self.compute_s = 0.0
        self.bytes = 0
        self._depth = 0

    @contextmanager
    def compute(self) -> Iterator[None]:
        """Counts the time spent inside the block as compute."""
        self._depth += 1
        t0 = self._clock() if self._depth == 1 else None
        try:
            yield
        finally:
            self._depth -= 1
            if t0 is not None:
                self.compute_s += self._clock() - t0

    def add_bytes(self, n: int) -> None:
        if n < 0:
            raise ValueError(f"negative byte count {n}")
        self.bytes += n

    def wall_s(self) -> float:
        return self._clock() - self._start

    def utilisation(self) -> float:
        """Compute time / wall time since start (0.0 before any wall time has passed)."""
        wall = self.wall_s()
        return self.compute_s / wall if wall > 0 else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "wall_s": self.wall_s(),
            "compute_s": self.compute_s,
            "utilisation": self.utilisation(),
            "bytes": self.bytes,
        }
