"""The torch.distributed backend "lowcomm".

    import lowcomm  # registers the backend (so does `import lowcomm.torch`)
    torch.distributed.init_process_group("lowcomm", ...)  # or new_group(backend="lowcomm")

Rendezvous goes through the store torch hands the backend (torchrun, env://, tcp://, file://).
Exact by default; `pg_options=lowcomm.torch.Options(codec="q4")` (or LOWCOMM_CODEC) compresses
floating-point sum/avg all-reduces of at least `codec_threshold` bytes (default 1 MiB).
CPU and CUDA tensors (the latter with Gloo's semantics: `wait()` blocks the host until the
operation completes, then orders the current stream; docs/torch.md, "CUDA tensors").
"""
from __future__ import annotations

import atexit
import datetime
from typing import Callable

import torch
import torch.distributed as dist

from lowcomm import _C

BACKEND = "lowcomm"


class Options:
    """The group's options: pass as `pg_options` to `init_process_group` or `new_group`.

    codec: all-reduces of floating-point SUM/AVG of at least `codec_threshold` bytes are
      compressed with it ("q4", "q8:sr", "minmax4", ...); "" (the default) keeps every op exact.
    error_feedback: keep a residual per gradient buffer across the compressed calls, keyed by
      "address" (True): the tensor's address and shape, for buffers that live across steps
        (DDP's buckets, gradients accumulated in place);
      "order": the call's place in the repeating sequence of compressed calls, for trainers
        that all-reduce a fresh tensor per parameter every step (`p.grad = a - b;
        dist.all_reduce(p.grad)`, as DiLoCo scripts do), whose addresses mean nothing;
      False / None / "" (the default): off.
    direct_bytes: all-reduces of at most this many bytes take one hop (each rank's tensor to
      every rank, reduced there): one one-way delay instead of two, for trainers that
      all-reduce small tensors one by one over a long link; uncompressed, the same bits.
    sparse_schedule: a randk codec's all-reduce: "gather-all" (every message to every rank, one
      quantization, one one-way delay), "owner" (the owner reduction over the positions every
      rank shares: fewer bytes from three ranks on, two quantizations, two delays) or "auto"
      (whichever ran faster for that size; docs/sparse.md).
    Unset fields come from LOWCOMM_CODEC, LOWCOMM_CODEC_THRESHOLD, LOWCOMM_ERROR_FEEDBACK
    (0, 1 = address, address, order), LOWCOMM_DIRECT_BYTES (default 0: never),
    LOWCOMM_SPARSE_SCHEDULE (default auto).
    """

    def __init__(self, codec=None, codec_threshold=None, error_feedback=None,
                 direct_bytes=None, sparse_schedule=None):
        # The variables as the library parses them (README, "Environment"): sizes take 4M.
        env = _C.env_value
        self.codec = codec if codec is not None else (env("LOWCOMM_CODEC") or "")
        self.codec_threshold = int(codec_threshold if codec_threshold is not None
                                   else (env("LOWCOMM_CODEC_THRESHOLD") or 1 << 20))
        ef = error_feedback if error_feedback is not None else (
            env("LOWCOMM_ERROR_FEEDBACK") or "")
        self.error_feedback = _ef_mode(ef)
        self.direct_bytes = -1 if direct_bytes is None else int(direct_bytes)
        self.sparse_schedule = "" if sparse_schedule is None else str(sparse_schedule)


def _ef_mode(value):
    if value is True or value in ("1", "address"):
        return "address"
    if value in (False, None, "", "0"):
        return ""
    if value == "order":
        return "order"
    raise ValueError(f"lowcomm: error_feedback must be 'address' (True), 'order' or off, got "
                     f"{value!r}")


def _create(dist_opts, backend_options):
    opts = backend_options if isinstance(backend_options, Options) else Options()
    if backend_options is not None and not isinstance(backend_options, Options):
        raise TypeError("lowcomm: pg_options must be lowcomm.torch.Options, got "
                        f"{type(backend_options).__name__}")
    # torch >= 2.15's enable_reconfigure: no communicator until dist._reconfigure gives one.
    return _C.create_backend(dist_opts.store, dist_opts.group_rank, dist_opts.group_size,
                             dist_opts.timeout, opts.codec, opts.codec_threshold,
                             opts.error_feedback, opts.direct_bytes,
                             bool(getattr(dist_opts, "enable_reconfigure", False)),
                             opts.sparse_schedule)


if BACKEND not in dist.Backend.backend_list:
    # One backend object serves both devices (torch creates it once, with the store prefix of
    # the first device, "cpu/"): CUDA tensors go through the library's device path or are
    # staged through pinned host memory (docs/torch.md, "CUDA tensors"). An extension built
    # without CUDA (WITH_CUDA False) refuses them with a clear error instead of torch's "no
    # backend for cuda".
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu", "cuda"])
    # Groups never destroyed are closed (aborted) before the interpreter finalizes: a
    # communicator thread must not release Python objects after that (backend.h).
    atexit.register(_C.close_all_at_exit)


WITH_CUDA = bool(_C.WITH_CUDA)
"""Whether this build of the extension takes CUDA tensors (setup.py: a torch with CUDA and a
CUDA toolkit, LOWCOMM_TORCH_CUDA not 0)."""


def last_op_stats(group=None):
    """Statistics of the group's last completed operation (bytes on the wire, ratio, times).
    For CUDA tensors on the library's device path: device_to_host_bytes, host_to_device_bytes
    (what crossed PCIe each way) and device_path ("gpu-codec": encoded and decoded on the GPU;
    "staged": through pinned host memory); 0 and "" for CPU tensors and for the operations the
    plugin stages itself (gather, scatter, all-to-all, send/recv)."""
    return _backend(group).last_op_stats()


def _backend(group=None):
    pg = group if group is not None else dist.group.WORLD
    backend = pg._get_backend(torch.device("cpu"))
    # TORCH_DISTRIBUTED_DEBUG=DETAIL: torch wraps the backend in its checking wrapper
    while hasattr(backend, "wrapped_pg") and not isinstance(backend, _C.LowcommBackend):
        backend = backend.wrapped_pg
    if not isinstance(backend, _C.LowcommBackend):
        raise RuntimeError("lowcomm.torch: the group's CPU backend is not lowcomm "
                           f"({type(backend).__name__})")
    return backend


def get_error(group=None):
    """The group's Backend::getError() by name: "SUCCESS", or why the group broke ("TIMEOUT",
    "REMOTE_ERROR", "COMM_ERROR"); torch 2.15's Backend.get_error() says the same."""
    return _backend(group).error_type()


def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    """torch.distributed.monitored_barrier for a lowcomm group, on every torch this package
    supports (before 2.15, torch's own function accepts only Gloo groups): every rank reports
    to rank 0, which raises naming the rank (wait_all_ranks: every rank) that did not come within
    `timeout` (default: torch's default process-group timeout, as torch's own function). A
    failure aborts the group."""
    pg = group if group is not None else dist.group.WORLD
    if timeout is None:
        timeout = dist.default_pg_timeout
    elif not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=timeout)
    pg.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)


def all_reduce(tensor: torch.Tensor, op=dist.ReduceOp.SUM, codec: str = "",
               error_feedback_key: str = "", group=None, async_op: bool = False,
               step: int | None = None, owner_error_feedback: bool = False):
    """One all-reduce with its own codec ("q4", "q8:sr", ...; "" exact) and error feedback,
    on a lowcomm group, whatever the group's options say.

    error_feedback_key: the name of the residual kept across calls ("grads", "layer3/w"); ""
      (the default) keeps none. Error feedback is only ever by name here: one name per
      tensor, the same name for that tensor every step (a name that meets a tensor of another
      size fails the call). Names are paths: `reset_error_feedback(group, "layer3")` drops
      "layer3" and every "layer3/...". A name needs a lossy codec.
    step: fixes the stochastic-rounding step (default: the group's operation number), so a run
      resumed in a new group rounds as the uninterrupted one did.
    owner_error_feedback: the owners' re-quantization of the average keeps a residual too
      (under the same name; needs one).
    Returns the Work when async_op, else None once the result is in `tensor`."""
    if not isinstance(error_feedback_key, str):
        raise TypeError("lowcomm.torch.all_reduce: error_feedback_key is the residual's name "
                        f"(a str, '' for none), got {error_feedback_key!r}")
    if error_feedback_key and not codec:
        raise ValueError(f"lowcomm.torch.all_reduce: error_feedback_key={error_feedback_key!r} "
                         "needs a lossy codec (codec='' is exact: nothing to feed back)")
    if owner_error_feedback and not error_feedback_key:
        raise ValueError("lowcomm.torch.all_reduce: owner_error_feedback needs an "
                         "error_feedback_key to keep its residual under")
    work = _backend(group).allreduce_with(tensor, codec, error_feedback_key, op,
                                          -1 if step is None else int(step),
                                          bool(owner_error_feedback))
    if async_op:
        return work
    work.wait()
    return None


def error_feedback_keys(group=None) -> list[str]:
    """The names under which the group holds error-feedback residuals, sorted: those given to
    `all_reduce(error_feedback_key=)`, the DDP hook's "<name>/bucket<i>", DiLoCo's
    "<name>/frag<f>", and the group options' "ef/<address>/<shape>" ("address") or
    "ef/order/<slot>/<dtype+shape>" ("order"). Waits for the group's queued operations."""
    return list(_backend(group).error_feedback_keys())


def reset_error_feedback(group=None, name: str | None = None) -> int:
    """Drops error-feedback residuals of the group, freeing their memory: `name` and every key
    below it ("name/..."), or every residual when `name` is None (the call-order keys then
    start over too). The next call under a dropped name starts from a zero residual. Returns
    how many keys were dropped.

    For residuals that will not be used again: tensors that are gone (the group options'
    "address" keys, under "ef"), a model that was replaced, a finished phase. Runs in order
    with the group's operations (after those queued before it) and waits for its turn. Local
    to this rank: every rank should reset alike, as every rank keeps alike."""
    if name is not None and (not isinstance(name, str) or not name.rstrip("/")):
        raise ValueError("lowcomm.torch.reset_error_feedback: name must be a non-empty str, or "
                         f"None for every residual, got {name!r}")
    return int(_backend(group).reset_error_feedback("" if name is None else name.rstrip("/")))


class _HookState:
    """The DDP hook's state: its codec, and one error-feedback residual per gradient bucket,
    named "<name>/bucket<index>" in the group's store."""

    def __init__(self, codec: str, error_feedback: bool, group, name: str):
        self.codec = codec
        self.error_feedback = error_feedback
        self.group = group
        self.name = name
        self._bucket_numel: dict[int, int] = {}

    def key(self, index: int, numel: int) -> str:
        """The residual's name for bucket `index` of `numel` elements ("" without error
        feedback). DDP rebuilds its buckets once, after the first step, in the order gradients
        became ready: a bucket index whose size changed starts over from a zero residual."""
        if not self.error_feedback:
            return ""
        key = f"{self.name}/bucket{index}"
        if self._bucket_numel.setdefault(index, numel) != numel:
            reset_error_feedback(self.group, key)
            self._bucket_numel[index] = numel
        return key

    def save(self) -> bytes:
        """The group's error-feedback residuals (every name, not only this hook's), as bytes
        for a checkpoint."""
        return _backend(self.group).save_error_feedback()

    def load(self, data: bytes) -> None:
        """Restores what save() returned (replacing every residual of the group)."""
        _backend(self.group).restore_error_feedback(data)

    def reset(self) -> int:
        """Drops this hook's residuals ("<name>/..."); returns how many there were."""
        self._bucket_numel.clear()
        return reset_error_feedback(self.group, self.name)


def ddp_comm_hook(codec: str = "q4", error_feedback: bool = True, group=None,
                  name: str = "ddp") -> tuple[_HookState, Callable]:
    """A DDP communication hook that averages each gradient bucket with `codec`:

        state, hook = lowcomm.torch.ddp_comm_hook(codec="q4")
        model.register_comm_hook(state, hook)

    Error feedback keeps one residual per bucket, named "<name>/bucket<index>" (give each DDP
    model on the same group its own `name`); `state.save()` / `state.load()` checkpoint the
    group's residuals, `state.reset()` drops this hook's."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"lowcomm.torch.ddp_comm_hook: name must be a non-empty str, got "
                         f"{name!r}")
    state = _HookState(codec, error_feedback, group, name)

    def hook(st: _HookState, bucket):
        tensor = bucket.buffer()
        key = st.key(bucket.index(), tensor.numel())
        work = _backend(st.group).allreduce_with(tensor, st.codec, key, dist.ReduceOp.AVG)
        return work.get_future().then(lambda fut: fut.value()[0])

    return state, hook
