"""Elastic groups: members die, freeze, leave and join between collectives; every all-reduce
commits on all live members or raises ElasticAborted with the tensor untouched; a member out
of the group for good (evicted, no quorum) raises ElasticFenced, at once on every later call
(lowcomm::ElasticCommunicator, docs/membership.md).

    import torch.distributed as dist
    from lowcomm.elastic import ElasticGroup
    store = dist.TCPStore(host, port, world, rank == 0)
    g = ElasticGroup.init(store, rank, world, retries=2)     # the founding members
    g.all_reduce(t, average=True, codec="q4")                 # in place, blocking
    j = ElasticGroup.join(store)                              # later, a new member

The store carries the group id and the members' addresses (each member publishes its own); a
joiner may also be given `seeds` (members' `member_address()`) and the id directly, so that the
store's host is not needed once the group runs. `lowcomm.diloco.DiLoCo(model, group=g)` runs
DiLoCo on an elastic group: a round that loses a worker completes with the survivors, and a
joiner fetches the global parameters and the outer optimizer's state (DiLoCo.catch_up).

CUDA tensors: the elastic communicator takes host memory, so a CUDA tensor is staged here
through pinned host memory: copied to the host before the collective (the host waits for the
device's current stream) and back after it (on the current stream). Registered CUDA state has
a pinned host mirror that the group reads and a joiner's fetch writes: it is refreshed from the
device before every collective and copied back after it, so the device tensor stays what the
group holds. These copies are the whole tensors (no GPU encoding on this path).
"""
import contextlib

import torch

from lowcomm import _C

ElasticAborted = _C.ElasticAborted
# This member is out of its group for good (evicted, no quorum, left): every later call raises
# it at once. Not an ElasticAborted (which means "call again"): rejoin as a new member.
ElasticFenced = _C.ElasticFenced

_PREFIX = "lowcomm/elastic"


class ElasticGroup:
    """A member of an elastic group (see the module doc). Founders: ElasticGroup.init; new
    members: ElasticGroup.join. rank()/size() are this view's; they change with the view."""

    def __init__(self, impl, group_id, store=None, prefix=_PREFIX, joined=False):
        self._impl = impl
        self.id = group_id
        self._store = store
        self._prefix = prefix
        self.fresh = joined  # a joiner before its first collective: it holds no state yet
        self._state = {}     # name -> tensor (kept alive here: the core holds raw pointers)
        self._mirrors = []   # (CUDA state tensor, its pinned host mirror the core holds)
        if store is not None:
            n = store.add(f"{prefix}/naddr", 1)
            store.set(f"{prefix}/addr/{n}", impl.member_address())

    @classmethod
    def init(cls, store, rank, world_size, *, prefix=_PREFIX, bind="", retries=2,
             failure_timeout=1.5, view_change_timeout=30.0, timeout=1800):
        """The founding members: every rank of [0, world_size) calls it; rank 0 creates the id.
        bind: the address the group's sockets use ("" the first interface that is up)."""
        if rank == 0:
            gid = _C.create_unique_id(bind)
            store.set(f"{prefix}/id", gid)
        else:
            gid = store.get(f"{prefix}/id").decode()
        impl = _C.ElasticGroup.found(gid, rank, world_size, retries,
                                     int(failure_timeout * 1000),
                                     int(view_change_timeout * 1000), int(timeout))
        return cls(impl, gid, store, prefix)

    @classmethod
    def join(cls, store=None, *, group_id=None, seeds=None, prefix=_PREFIX, retries=2,
             failure_timeout=1.5, view_change_timeout=30.0, timeout=1800):
        """A new member, entering through the newest published members first (or `seeds`).
        Returns once admitted, at the group's next commit."""
        if group_id is None:
            if store is None:
                raise ValueError("lowcomm.elastic: join needs a store or a group_id and seeds")
            group_id = store.get(f"{prefix}/id").decode()
        if seeds is None:
            if store is None:
                raise ValueError("lowcomm.elastic: join needs a store or seeds")
            n = int(store.add(f"{prefix}/naddr", 0))
            seeds = [store.get(f"{prefix}/addr/{i}").decode() for i in range(n, 0, -1)]
        impl = _C.ElasticGroup.join(group_id, list(seeds), retries, int(failure_timeout * 1000),
                                    int(view_change_timeout * 1000), int(timeout))
        return cls(impl, group_id, store, prefix, joined=True)

    def all_reduce(self, tensor, *, average=True, codec="", error_feedback_key=""):
        """In place, blocking (fp32, contiguous; CPU, or CUDA staged through the host). A fresh
        joiner's first call contributes nothing and fetches the registered state before it
        returns."""
        with self._staged(tensor) as host:
            self._impl.all_reduce(host, average, codec or "", error_feedback_key or "")
        self.fresh = False

    def broadcast(self, tensor, root):
        """In place, blocking: every member's tensor becomes member `root`'s (a member id, as
        in view()). On ElasticAborted the tensor is untouched; a broadcast whose root left the
        group is not retried."""
        with self._staged(tensor) as host:
            self._impl.broadcast(host, int(root))
        self.fresh = False

    def all_gather(self, tensor):
        """Blocking. Returns (gathered, (view id, member ids)): gathered[i] is the tensor of the
        i-th member of the view the call committed in (a retry after a failure runs in a smaller
        view); on the tensor's device."""
        with self._staged(tensor, back=False) as host:
            out, view = self._impl.all_gather(host)
        self.fresh = False
        return out.to(tensor.device), (view[0], list(view[1]))

    def register_state(self, name, tensor):
        """A tensor every replica holds alike and changes only between collectives (checked by
        hash at every commit; fetched by joiners). Contiguous; CPU, or CUDA with a pinned host
        mirror (module doc); kept alive by the group."""
        self._state[name] = tensor
        if tensor.device.type == "cpu":
            self._impl.register_state(name, tensor)
            return
        if not tensor.is_contiguous():
            raise ValueError("lowcomm: registered state must be contiguous")
        mirror = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        mirror.copy_(tensor)
        self._mirrors.append((tensor, mirror))
        self._impl.register_state(name, mirror)

    @contextlib.contextmanager
    def _staged(self, tensor, back=True):
        """The tensor as the core takes it (host memory) for one collective, and the registered
        CUDA state's mirrors refreshed before it and copied back after it (also when it fails:
        a joiner's fetch may have written them)."""
        for dev, mirror in self._mirrors:
            mirror.copy_(dev)
        try:
            if tensor.device.type == "cpu":
                yield tensor
                return
            if not tensor.is_contiguous():
                raise ValueError("lowcomm: the tensor must be contiguous")
            host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            host.copy_(tensor)
            yield host
            if back:
                tensor.copy_(host)
        finally:
            for dev, mirror in self._mirrors:
                dev.copy_(mirror)

    def rank(self):
        return self._impl.rank()

    def size(self):
        return self._impl.size()

    def view(self):
        """(view id, member ids). While state() is not "live", the last view this member knew
        (view_current() is False): some of its members may be gone."""
        return self._impl.view()

    def view_current(self):
        return self._impl.view_current()

    def state(self):
        """"live", "changing" (a view change in progress) or "fenced" (out of the group for
        good: every call raises ElasticFenced)."""
        return self._impl.state()

    def member_id(self):
        return self._impl.member_id()

    def member_address(self):
        return self._impl.member_address()

    def stats(self):
        return self._impl.stats()

    def status(self):
        """"" while this member takes part; else why not (evicted, no quorum, left)."""
        return self._impl.status()

    def close(self):
        """Leave the group now (the others form a view without this member at once)."""
        self._impl = None
