"""The torch.distributed backend "lowcomm".

    import lowcomm.torch  # registers the backend
    torch.distributed.init_process_group("lowcomm", ...)  # or new_group(backend="lowcomm")

Rendezvous goes through the store torch hands the backend (torchrun, env://, tcp://, file://).
Exact by default; LOWCOMM_CODEC (e.g. "q4") compresses floating-point sum/avg all-reduces of at
least LOWCOMM_CODEC_THRESHOLD bytes (default 1 MiB), with error feedback per gradient buffer
when LOWCOMM_ERROR_FEEDBACK=1.
"""
import torch.distributed as dist

from lowcomm import _C

BACKEND = "lowcomm"


def _create(store, group_rank, group_size, timeout):
    return _C.create_backend(store, group_rank, group_size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def last_op_stats(group=None):
    """Statistics of the group's last completed operation (bytes on the wire, ratio, times)."""
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(dist.distributed_c10d._get_pg_default_device(pg))
    return backend.last_op_stats()
