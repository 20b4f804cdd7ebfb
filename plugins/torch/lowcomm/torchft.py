"""lowcomm as torchft's process group: torchft's Manager, LocalSGD and DiLoCo run their
collectives on lowcomm (its TCP transport, its codecs) instead of Gloo.

    from torchft import Manager
    from lowcomm.torchft import ProcessGroupLowcomm
    pg = ProcessGroupLowcomm(timeout=timedelta(seconds=10))            # exact, like Gloo
    pg = ProcessGroupLowcomm(codec="q8", codec_threshold=1 << 20)      # compressed all-reduces
    manager = Manager(pg=pg, ...)

torchft rebuilds the process group whenever its quorum changes (ProcessGroupWrapper.configure:
the old one is aborted, a new one is made over a fresh store prefix); this class only says how
one is made: torch's ProcessGroup with the lowcomm c10d backend for CPU and CUDA tensors. A
codec here applies to the float sum/average all-reduces of at least codec_threshold bytes, as with
init_process_group's lowcomm.torch.Options; torchft's Manager sends averages as sums and
divides after, which lowcomm compresses alike. Needs torchft (PyPI `torchft`, tested with 0.2.0).

A quorum's members are alive and configure together (the Lighthouse put them in it moments
before), so a group is made with a join timeout (1.5 s by default): a member frozen since the
quorum (SIGSTOP, a hung host) fails the others' configure in that time, naming it, and torchft
moves on to a quorum without it, instead of waiting for `timeout`. A frozen member of a group
already made fails the collective that waits on it (LOWCOMM_FAILURE_TIMEOUT_MS).
"""
import weakref
from datetime import timedelta

import torch
from torch.distributed import ProcessGroup as BaseProcessGroup
from torchft.process_group import ProcessGroupWrapper

from lowcomm import _C
from lowcomm.torch import Options


class ProcessGroupLowcomm(ProcessGroupWrapper):
    """A reconfigurable lowcomm process group for torchft (see the module doc)."""

    def __init__(self, timeout=timedelta(seconds=60), *, codec=None, codec_threshold=None,
                 error_feedback=None, direct_bytes=None, sparse_schedule=None,
                 join_timeout=timedelta(milliseconds=1500)):
        super().__init__(timeout=timeout)
        # None or 0: the members may arrive as late as `timeout` (no join timeout).
        self._join_ms = 0 if join_timeout is None else int(join_timeout.total_seconds() * 1000)
        if self._join_ms < 0:
            raise ValueError(f"join_timeout must not be negative, got {join_timeout}")
        # Unset fields from the environment, as lowcomm.torch.Options does.
        self._opts = Options(codec, codec_threshold, error_feedback, direct_bytes,
                             sparse_schedule)

    def _create_pg(self, store, rank, world_size):
        pg = BaseProcessGroup(store, rank, world_size)
        pg._set_default_backend(BaseProcessGroup.BackendType.CUSTOM)
        o = self._opts
        backend = _C.create_backend(store, rank, world_size, self._timeout, o.codec,
                                    o.codec_threshold, o.error_feedback, o.direct_bytes,
                                    sparse_schedule=o.sparse_schedule,
                                    join_timeout_ms=self._join_ms)
        # One backend for both devices, as lowcomm.torch registers it (docs/torch.md, "CUDA
        # tensors").
        for device in ("cpu", "cuda"):
            pg._register_backend(torch.device(device), BaseProcessGroup.BackendType.CUSTOM,
                                 backend)
        # Dropped (or left at exit) without shutdown: close at once too (see shutdown()).
        weakref.finalize(pg, backend.abort)
        return pg

    def shutdown(self):
        """torchft drops a process group whenever its replica stops or restarts, without the
        others doing the same at that moment: close at once (abort) instead of the graceful
        goodbye of destroy_process_group, which would wait for every peer to close too."""
        pg = self._pg
        if pg is not None:
            pg.abort()
        super().shutdown()

    def getBackendName(self):
        return "torchft-lowcomm"
