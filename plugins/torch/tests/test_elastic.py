"""lowcomm.elastic and DiLoCo on an elastic group: real processes, a worker killed in the middle
of training, a new worker joining through the store; every live worker ends with bitwise the
same global parameters (docs/membership.md)."""
import hashlib
import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

H = 4          # inner steps per round
ROUNDS = 12    # outer rounds the group runs
KILL_AT = 4    # founder 2 dies during this round's all-reduce
JOIN_AT = 6    # the joiner starts once founder 0 has finished this round


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))


def _batch(member, step):
    g = torch.Generator().manual_seed(1000 * member + step)
    x = torch.randn(32, 16, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def _digest(t):
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()[:16]


def _train(outer, model, member, until_round, out, kill_round=None):
    import lowcomm.diloco  # noqa: F401
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    size = outer.group.size()
    while outer.rounds[0] < until_round:
        x, y = _batch(member, step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if kill_round is not None and outer.rounds[0] == kill_round and \
                outer.inner_steps % H == H - 1:
            # SIGKILL a few milliseconds into this round's all-reduce.
            import threading
            threading.Timer(0.003, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        # The view as the round's all-reduce begins: read after the run, a member that finished
        # first and left would already be gone from it.
        size = outer.group.size()
        if member < 3 and outer.rounds[0] > JOIN_AT and size < 3:
            # Until the joiner is admitted (at a commit, so the founders must keep running
            # rounds), slow the rounds down: on a loaded machine the founders must not finish
            # before the joiner got in.
            time.sleep(0.05)
        outer.step()
        if member == 0 and outer.rounds[0] == JOIN_AT:
            open(out + ".joinnow", "w").close()
            while not os.path.exists(out + ".joining"):
                time.sleep(0.005)
    outer.finish()
    with open(f"{out}.{member}", "w") as f:
        f.write(f"{_digest(outer.global_params[0])} {size} {float(loss.detach()):.6f}")


def _founder(rank, world, store_path, out):
    import lowcomm.diloco
    from lowcomm.elastic import ElasticGroup
    store = dist.FileStore(store_path, -1)
    g = ElasticGroup.init(store, rank, world, bind="127.0.0.1", retries=2, failure_timeout=3.0)
    model = _model(0)
    outer = lowcomm.diloco.DiLoCo(model, group=g, sync_every=H, codec="q4")
    _train(outer, model, rank, ROUNDS, out, kill_round=KILL_AT if rank == 2 else None)


def _joiner(store_path, out):
    import lowcomm.diloco
    from lowcomm.elastic import ElasticGroup
    while not os.path.exists(out + ".joinnow"):
        time.sleep(0.01)
    store = dist.FileStore(store_path, -1)
    open(out + ".joining", "w").close()
    g = ElasticGroup.join(store, failure_timeout=3.0)
    model = _model(7)  # other initial weights: the fetched state must replace them
    outer = lowcomm.diloco.DiLoCo(model, group=g, sync_every=H, codec="q4")
    outer.catch_up()
    _train(outer, model, 3 + g.member_id(), ROUNDS, out)


def test_diloco_survives_a_kill_and_admits_a_joiner(tmp_path):
    ctx = mp.get_context("spawn")
    store_path, out = str(tmp_path / "store"), str(tmp_path / "out")
    procs = [ctx.Process(target=_founder, args=(r, 3, store_path, out)) for r in range(3)]
    procs.append(ctx.Process(target=_joiner, args=(store_path, out)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    assert codes == [0, 0, -signal.SIGKILL, 0], codes
    results = {}
    for name in os.listdir(tmp_path):
        if name.startswith("out.") and name[4:].isdigit():
            results[int(name[4:])] = open(tmp_path / name).read().split()
    assert sorted(results) == [0, 1, 3 + 3], results  # the joiner is member 3
    digests = {r[0] for r in results.values()}
    assert len(digests) == 1, results          # bitwise identical global parameters
    assert all(r[1] == "3" for r in results.values()), results  # 0, 1 and the joiner


def _group_worker(rank, world, store_path, out):
    from lowcomm.elastic import ElasticAborted, ElasticGroup
    store = dist.FileStore(store_path, -1)
    g = ElasticGroup.init(store, rank, world, bind="127.0.0.1", retries=0, failure_timeout=3.0)
    t = torch.full((1000,), float(rank + 1))
    g.all_reduce(t, average=False)
    assert float(t[0]) == 6.0
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    t = torch.full((1000,), float(rank + 1))
    try:
        g.all_reduce(t, average=False)
        first = "ok"
    except ElasticAborted as e:
        assert "aborted" in str(e)
        assert float(t[0]) == rank + 1  # untouched
        first = "aborted"
        g.all_reduce(t, average=False)
    b = torch.full((100,), float(rank))
    g.broadcast(b, 1)
    assert torch.equal(b, torch.full((100,), 1.0))
    gathered, (view, members) = g.all_gather(torch.full((3,), float(10 * rank), dtype=torch.float64))
    assert gathered.shape == (2, 3) and gathered.dtype == torch.float64
    assert [float(gathered[i][0]) for i in range(2)] == [10.0 * m for m in members]
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{first} {float(t[0])} {g.size()} {g.view()[1]}")


def test_elastic_group_abort_leaves_the_tensor_and_the_call_works_again(tmp_path):
    ctx = mp.get_context("spawn")
    store_path, out = str(tmp_path / "store"), str(tmp_path / "out")
    procs = [ctx.Process(target=_group_worker, args=(r, 3, store_path, out)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, -signal.SIGKILL]
    for r in range(2):
        first, value, size, members = open(f"{out}.{r}").read().split(" ", 3)
        assert float(value) == 3.0 and size == "2" and members == "[0, 1]", (first, value)


def _fenced_worker(rank, store_path, out):
    from lowcomm.elastic import ElasticAborted, ElasticFenced, ElasticGroup
    store = dist.FileStore(store_path, -1)
    g = ElasticGroup.init(store, rank, 2, bind="127.0.0.1", retries=2, failure_timeout=3.0)
    t = torch.ones(1000)
    g.all_reduce(t, average=False)
    assert g.state() == "live" and g.view_current()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    # Alone, one of two: no quorum. The call fails for good, and so does every later one, at once.
    t = torch.ones(1000)
    with pytest.raises(ElasticFenced) as first:
        g.all_reduce(t, average=False)
    assert not isinstance(first.value, ElasticAborted)  # "call again" loops end here
    assert "no quorum" in str(first.value) and float(t[0]) == 1.0
    start = time.monotonic()
    with pytest.raises(ElasticFenced):
        g.all_reduce(t, average=False)
    again = time.monotonic() - start
    with open(f"{out}.{rank}", "w") as f:
        f.write(f"{g.state()} {g.view_current()} {again:.3f} {g.view()[1]}")


def test_a_fenced_member_gets_elastic_fenced_at_once_on_every_call(tmp_path):
    ctx = mp.get_context("spawn")
    store_path, out = str(tmp_path / "store"), str(tmp_path / "out")
    procs = [ctx.Process(target=_fenced_worker, args=(r, store_path, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, -signal.SIGKILL]
    state, current, again, members = open(f"{out}.0").read().split(" ", 3)
    assert state == "fenced" and current == "False", (state, current)
    assert float(again) < 1.0, again  # the terminal result, not another wait
    assert members == "[0, 1]"  # the last view it knew, marked not current


def test_diloco_refuses_elastic_options_it_cannot_keep():
    import lowcomm.diloco

    class FakeGroup(lowcomm.elastic.ElasticGroup):
        def __init__(self):
            pass

        def size(self):
            return 1

    with pytest.raises(ValueError, match="elastic group"):
        lowcomm.diloco.DiLoCo(_model(0), group=FakeGroup(), sync_every=4, overlap=True)
