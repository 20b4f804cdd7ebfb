"""The torch.distributed backend "lowcomm".

    import lowcomm.torch  # registers the backend
    torch.distributed.init_process_group("lowcomm", ...)  # or new_group(backend="lowcomm")

Rendezvous goes through the store torch hands the backend (torchrun, env://, tcp://, file://).
Exact by default; LOWCOMM_CODEC (e.g. "q4") compresses floating-point sum/avg all-reduces of at
least LOWCOMM_CODEC_THRESHOLD bytes (default 1 MiB), with error feedback per gradient buffer
when LOWCOMM_ERROR_FEEDBACK=1.
"""
import torch
import torch.distributed as dist

from lowcomm import _C

BACKEND = "lowcomm"


def _create(store, group_rank, group_size, timeout):
    return _C.create_backend(store, group_rank, group_size, timeout)


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])


def last_op_stats(group=None):
    """Statistics of the group's last completed operation (bytes on the wire, ratio, times)."""
    return _backend(group).last_op_stats()


def _backend(group=None):
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    if not isinstance(backend, _C.LowcommBackend):
        raise RuntimeError("lowcomm.torch: the group's CPU backend is not lowcomm "
                           f"({type(backend).__name__})")
    return backend


def all_reduce(tensor, op=dist.ReduceOp.SUM, codec="", error_feedback_key="", group=None,
               async_op=False):
    """One all-reduce with its own codec ("q4", "q8:sr", ...; "" exact) and error-feedback key
    (residual kept across calls under that key; "" none), on a lowcomm group."""
    work = _backend(group).allreduce_with(tensor, codec, error_feedback_key, op)
    if async_op:
        return work
    work.wait()
    return None


class _HookState:
    """Error-feedback keys are per bucket, so each bucket's residual carries across steps."""

    def __init__(self, codec, error_feedback, group):
        self.codec = codec
        self.error_feedback = error_feedback
        self.group = group

    def save(self):
        """The group's error-feedback residuals, as bytes (for a checkpoint)."""
        return _backend(self.group).save_error_feedback()

    def load(self, data):
        _backend(self.group).restore_error_feedback(data)


def ddp_comm_hook(codec="q4", error_feedback=True, group=None):
    """A DDP communication hook that averages each gradient bucket with `codec`:

        state, hook = lowcomm.torch.ddp_comm_hook(codec="q4")
        model.register_comm_hook(state, hook)

    Error feedback keeps one residual per bucket (`state.save()` / `state.load()`)."""
    state = _HookState(codec, error_feedback, group)

    def hook(st, bucket):
        tensor = bucket.buffer()
        key = f"ddp/bucket{bucket.index()}" if st.error_feedback else ""
        work = _backend(st.group).allreduce_with(tensor, st.codec, key, dist.ReduceOp.AVG)
        return work.get_future().then(lambda fut: fut.value()[0])

    return state, hook
