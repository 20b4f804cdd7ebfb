"""torch 2.15's reconfigure (dist._get_reconfigure_handle, dist._reconfigure) on lowcomm.

Real processes on loopback. Each process makes a default group of its own in the
reconfigure regime (init_process_group(..., enable_reconfigure=True), world of one, no shared
rendezvous), exchanges handles through a FileStore, and reconfigures: three processes form a
group (ranks by list position), the first list's root is SIGKILLed, the survivors reconfigure
by a set of handles, and a fourth process joins them. Then the bad calls: a reused uuid,
a list without the caller, a handle twice, members that disagree on the uuid.
torch 2.11 has no reconfigure: the tests skip there.
"""
from __future__ import annotations

import os
import signal
import sys
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from _spawn import run_procs

import lowcomm  # noqa: F401  (registers the backend)

pytestmark = pytest.mark.skipif(not hasattr(dist, "_reconfigure"),
                                reason="this torch has no dist._reconfigure (torch >= 2.15)")


def _own_group(tmp: str, who: int) -> None:
    """A default lowcomm group in the reconfigure regime: a world of one, no members yet."""
    store = dist.FileStore(os.path.join(tmp, f"own{who}"), 1)
    dist.init_process_group("lowcomm", store=store, rank=0, world_size=1,
                            timeout=timedelta(seconds=20), enable_reconfigure=True)
    assert dist._supports_reconfigure()


def _oob(tmp: str) -> dist.Store:
    s = dist.FileStore(os.path.join(tmp, "oob"), -1)
    s.set_timeout(timedelta(seconds=90))
    return s


def _publish(oob: dist.Store, phase: str, who: int) -> None:
    oob.set(f"{phase}/{who}", dist._get_reconfigure_handle())


def _handles(oob: dist.Store, phase: str, members: list[int]) -> list[str]:
    return [oob.get(f"{phase}/{m}").decode() for m in members]


def _sum_check(members: list[int]) -> list[int]:
    """all_reduce of each member's (id + 1) and all_gather of the ids, in rank order."""
    me = int(os.environ["LC_WHO"])
    t = torch.full((1000,), float(me + 1))
    dist.all_reduce(t)
    want = float(sum(m + 1 for m in members))
    assert torch.equal(t, torch.full((1000,), want)), (t[:3], want)
    got = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(got, torch.tensor([me]))
    return [int(g) for g in got]


def lifecycle(who: int, world: int, tmp: str, errors) -> None:
    os.environ["LC_WHO"] = str(who)
    try:
        oob = _oob(tmp)
        _own_group(tmp, who)
        if who == 3:  # the joiner waits for the survivors' shrink
            oob.wait(["joiner/go"])
        else:
            with pytest.raises(RuntimeError, match="no members yet"):
                dist.all_reduce(torch.ones(4))
            # Three members; the list gives the ranks (reversed: process 2 is rank 0, the root).
            _publish(oob, "p1", who)
            handles = _handles(oob, "p1", [2, 1, 0])
            dist._reconfigure(uuid=101, handles=handles).wait()
            assert (dist.get_rank(), dist.get_world_size()) == (2 - who, 3)
            assert _sum_check([0, 1, 2]) == [2, 1, 0]
            oob.add("p1/done", 1)
            if who == 2:  # the root of that group dies
                while oob.add("p1/done", 0) < 3:
                    pass
                os.kill(os.getpid(), signal.SIGKILL)
            with pytest.raises(Exception):
                t = torch.ones(1 << 16)
                for _ in range(100):  # the death is seen at once or by the next call
                    dist.all_reduce(t)
            # The survivors, by a set of handles: ranks in the handles' sorted order.
            _publish(oob, "p2", who)
            hs = _handles(oob, "p2", [0, 1])
            dist._reconfigure(uuid=102, handles=set(hs), timeout=timedelta(seconds=20)).wait()
            assert dist.get_world_size() == 2
            assert dist.get_rank() == sorted(hs).index(hs[who])
            order = _sum_check([0, 1])
            assert order == sorted([0, 1], key=lambda m: hs[m]), order
            oob.set("joiner/go", "1")
        # The joiner enters: three members again, the joiner last.
        _publish(oob, "p3", who)
        dist._reconfigure(uuid=103, handles=_handles(oob, "p3", [0, 1, 3])).wait()
        assert dist.get_world_size() == 3
        assert _sum_check([0, 1, 3]) == [0, 1, 3]
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"process {who}: {traceback.format_exc()}")
        sys.exit(1)


def test_reconfigure_forms_loses_its_root_and_admits(tmp_path):
    errors = torch.multiprocessing.get_context("spawn").Queue()
    codes = run_procs(lifecycle, 4, (str(tmp_path), errors), timeout=240,
                      ctx=torch.multiprocessing.get_context("spawn"))
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert codes == [0, 0, -signal.SIGKILL, 0], codes


def bad_calls(who: int, world: int, tmp: str, errors) -> None:
    os.environ["LC_WHO"] = str(who)
    try:
        oob = _oob(tmp)
        _own_group(tmp, who)
        # Members that disagree on the uuid: both fail by the deadline, nobody hangs.
        _publish(oob, "a", who)
        hs = _handles(oob, "a", [0, 1])
        with pytest.raises(RuntimeError, match="reconfigure"):
            dist._reconfigure(uuid=200 + who, handles=hs, timeout=timedelta(seconds=3))
        with pytest.raises(RuntimeError, match="no members yet"):
            dist.all_reduce(torch.ones(4))
        oob.add("a/failed", 1)
        while oob.add("a/failed", 0) < 2:
            pass
        # Then a good one (fresh handles: the root's was spent).
        _publish(oob, "b", who)
        hs = _handles(oob, "b", [0, 1])
        dist._reconfigure(uuid=300, handles=hs).wait()
        assert _sum_check([0, 1]) == [0, 1]
        # Refused by name, and the group stays as it was.
        mine = dist._get_reconfigure_handle()
        with pytest.raises(ValueError, match="uuid 300 was used before"):
            dist._reconfigure(uuid=300, handles=hs)
        with pytest.raises(ValueError, match="not among the handles"):
            dist._reconfigure(uuid=301, handles=[h for h in hs if h != mine] or ["x"])
        with pytest.raises(ValueError, match="given twice"):
            dist._reconfigure(uuid=302, handles=[mine, mine])
        with pytest.raises(ValueError, match="the first handle"):
            dist._reconfigure(uuid=303, handles=["lowcomm1:nonsense", mine])
        assert _sum_check([0, 1]) == [0, 1]
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(f"process {who}: {traceback.format_exc()}")
        sys.exit(1)


def test_reconfigure_refuses_bad_calls_and_recovers(tmp_path):
    ctx = torch.multiprocessing.get_context("spawn")
    errors = ctx.Queue()
    codes = run_procs(bad_calls, 2, (str(tmp_path), errors), timeout=240, ctx=ctx)
    msgs = []
    while not errors.empty():
        msgs.append(errors.get())
    assert not msgs, "\n".join(msgs)
    assert codes == [0, 0], codes
