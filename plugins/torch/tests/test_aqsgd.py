"""lowcomm.aqsgd: the two ends' caches stay bit-identical over many steps, across a restart
from state_dict() and with a memory-mapped cache; a sample's first appearance travels at full
precision (or 8-bit), later ones as b-bit deltas whose error shrinks as activations settle;
a full cache (file or memory budget) sends further samples uncached at full precision, both ends
agreeing; per-channel scales keep the caches identical and cut the error where channels differ in size;
diverged caches, wrong samples and sub-8-bit gradients are refused with clear errors."""
import sys
import traceback
import warnings

import pytest
import torch
import torch.distributed as dist

from _spawn import run_world

import lowcomm.torch  # noqa: F401
from lowcomm import _C
from lowcomm.aqsgd import Link

SHAPE = (4, 64)


def activation(sample, step):
    """A sample's activation drifting slowly with the training step, as AQ-SGD assumes."""
    base = torch.Generator().manual_seed(sample)
    drift = torch.Generator().manual_seed(10_000 * step + sample)
    return torch.randn(*SHAPE, generator=base) + 0.01 * step * torch.randn(*SHAPE,
                                                                           generator=drift)


def batches(steps, n_samples=12, per=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randperm(n_samples, generator=g)[:per].tolist() for _ in range(steps)]


def run_steps(link, rank, plan, first_step=0):
    """Stage 0 sends activations and receives gradients; stage 1 the other way. Returns the
    largest error of a delta-coded (already cached) sample's activation on the receiver."""
    worst = 0.0
    for k, ids in enumerate(plan):
        step = first_step + k
        x = torch.stack([activation(s, step) for s in ids])
        if rank == 0:
            link.send(x, ids)
            g = link.recv_grad(ids)
            assert torch.allclose(g, 0.5 * x, atol=0.05 * x.abs().max().item())
        else:
            out = link.recv(ids)
            worst = max(worst, (out - x).abs().max().item())
            link.send_grad(0.5 * x, ids)
    return worst


def _caches(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        plan = batches(40)
        straight = Link(peer, SHAPE, bits=2)
        run_steps(straight, rank, plan)
        straight.verify()
        # The same plan stopped at step 17: state saved, fresh links (one memory-mapped)
        # loaded and checked against each other, and run to the end.
        first = Link(peer, SHAPE, bits=2, tag=200, capacity=2)  # grows as samples arrive
        run_steps(first, rank, plan[:17])
        state = first.state_dict()
        path = f"{init_file}.cache{rank}"
        resumed = Link(peer, SHAPE, bits=2, tag=300, capacity=16, cache_path=path)
        resumed.load_state_dict(state)  # verifies with the peer
        run_steps(resumed, rank, plan[17:], first_step=17)
        resumed.verify()
        assert resumed.cache.digest() == straight.cache.digest()
        assert resumed.cache.updates == straight.cache.updates == 40
        # A pair whose ends restored different checkpoints is told so.
        stale = Link(peer, SHAPE, bits=2, tag=400)
        stale.load_state_dict(state if rank == 0 else straight.state_dict(), verify=False)
        with pytest.raises(RuntimeError, match="caches of this rank and rank"):
            stale.verify()
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_caches_identical_on_both_ends_across_restart(tmp_path):
    run_world(_caches, 2, tmp_path)


def _first_appearance(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        n = SHAPE[0] * SHAPE[1]
        for first, tag in (("fp32", 100), ("q8", 200)):
            link = Link(peer, SHAPE, bits=2, first=first, tag=tag)
            x0 = torch.stack([activation(s, 0) for s in (0, 1)])
            x1 = torch.stack([activation(s, 1) for s in (1, 2)])  # sample 1 again, 2 new
            if rank == 0:
                link.send(x0, [0, 1])
                sent0 = link.bytes_sent
                link.send(x1, [1, 2])
                sent1 = link.bytes_sent - sent0
                head = (4 + 2) * 8
                per_new = 4 * n if first == "fp32" else _C.encoded_size("q8", n)
                assert sent0 == head + 2 * per_new
                assert sent1 == head + _C.encoded_size("q2", n) + per_new
            else:
                out0 = link.recv([0, 1])
                if first == "fp32":
                    assert torch.equal(out0, x0)  # first appearance: exact
                else:
                    q = torch.empty(2 * n)
                    _C.decode("q8", _C.encode("q8", x0.reshape(-1)), q)
                    assert torch.equal(out0.reshape(-1), q)
                out1 = link.recv([1, 2])
                assert not torch.equal(out1[0], x1[0])  # a 2-bit delta: close, not exact
                assert (out1[0] - x1[0]).abs().max() < 0.1
                assert link.cache.slots == {0: 0, 1: 1, 2: 2}
        # Asked for other samples than were sent: refused, naming both.
        link = Link(peer, SHAPE, bits=2, tag=300)
        if rank == 0:
            link.send(torch.zeros(1, *SHAPE), [5])
        else:
            with pytest.raises(RuntimeError, match=r"sent activations of samples \[5\], this "
                                                   r"rank expected \[6\]"):
                link.recv([6])
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_first_appearance_travels_at_full_precision_or_8_bit(tmp_path):
    run_world(_first_appearance, 2, tmp_path)


def _deltas_shrink(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        plan = [[0, 1, 2, 3]] * 6  # the same samples every step: only deltas after the first
        errs = {}
        for mode, tag in (("aqsgd", 100), ("direct", 200)):
            link = Link(peer, SHAPE, bits=2, mode=mode, tag=tag)
            run_steps(link, rank, plan[:1])
            errs[mode] = run_steps(link, rank, plan[1:], first_step=1)
        if rank == 1:
            # Deltas of 0.01 per step quantize to far less error than the activations do.
            assert errs["aqsgd"] < errs["direct"] / 10, errs
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_aqsgd_error_far_below_direct_quantization(tmp_path):
    run_world(_deltas_shrink, 2, tmp_path)


def _channel_scales(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        plan = batches(12)
        # Channels of very different magnitudes (as transformer activations have): one scale
        # per block mixes them, one per channel does not.
        gain = 2.0 ** (torch.arange(SHAPE[1]) % 8 - 4.0)
        errs = {}
        for scales, tag in (("block", 100), ("channel", 200)):
            link = Link(peer, SHAPE, bits=2, block=64, scales=scales, tag=tag)
            worst = 0.0
            for step, ids in enumerate(plan):
                x = torch.stack([activation(s, step) for s in ids]) * gain
                if rank == 0:
                    link.send(x, ids)
                    link.recv_grad(ids)
                else:
                    out = link.recv(ids)
                    new = ([i for i, s in enumerate(ids) if s not in seen] if step
                           else list(range(len(ids))))
                    old = [i for i in range(len(ids)) if i not in new]
                    if old:  # delta-coded samples only: the first appearance is exact
                        err = ((out[old] - x[old]).abs() / gain).mean().item()
                        worst = max(worst, err)
                    link.send_grad(0.5 * x, ids)
                seen = set(ids) | (seen if step else set())
            link.flush()
            link.verify()  # the two ends' caches: the same bits
            errs[scales] = worst
        if rank == 1:
            assert link.codec == f"q2:col={SHAPE[1]}"
            # Mean error per unit of gain (2.1x apart here): where a block's scale is set by
            # the large channels, the small ones' deltas round to zero.
            assert errs["channel"] < errs["block"] / 1.5, errs
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_channel_scales_keep_caches_identical_and_cut_error(tmp_path):
    run_world(_channel_scales, 2, tmp_path)


def _stochastic_gradients(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        link = Link(peer, SHAPE, backward="q4:block=64:sr", allow_low_bit_backward=True)
        g = torch.randn(2, *SHAPE, generator=torch.Generator().manual_seed(3))
        got = []
        for _ in range(16):  # the same gradient, sent again and again
            if rank == 1:
                link.send_grad(g, [0, 1])
            else:
                got.append(link.recv_grad([0, 1]))
        link.flush()
        if rank == 0:
            # Every message rounds with its own random numbers: the copies differ, and their
            # mean is far closer to the gradient than one copy (unbiased rounding).
            assert not torch.equal(got[0], got[1])
            one = (got[0] - g).abs().mean()
            mean = (torch.stack(got).mean(0) - g).abs().mean()
            assert mean < one / 2.5, (float(one), float(mean))
        assert link.state_dict()["grad_offset"] == (16 * g.numel() if rank == 1 else 0)
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_stochastically_rounded_gradients_draw_fresh_randomness_per_message(tmp_path):
    run_world(_stochastic_gradients, 2, tmp_path)


def _rotation(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        plan = batches(10)
        errs = {}
        spike = torch.zeros(SHAPE)
        spike[:, ::64] = 8.0  # one large element per block of 64: it sets the block's scale
        for mode, bits, rotate, tag in (("aqsgd", 2, False, 100), ("aqsgd", 2, True, 200),
                                        ("direct", 2, True, 300), ("direct", 2, False, 400)):
            link = Link(peer, SHAPE, bits=bits, block=64, mode=mode, rotate=rotate, tag=tag)
            worst = 0.0
            for step, ids in enumerate(plan):
                x = torch.stack([activation(s, step) for s in ids])
                if mode == "direct":
                    x = x + spike
                if rank == 0:
                    link.send(x, ids)
                    link.recv_grad(ids)
                else:
                    out = link.recv(ids)
                    if step > 0:
                        worst = max(worst, (out - x).pow(2).mean().sqrt().item())
                    link.send_grad(0.5 * x, ids)
            link.flush()
            if mode == "aqsgd":
                link.verify()  # the two ends' caches: the same bits, rotated or not
            errs[(mode, bits, rotate)] = worst
        if rank == 1:
            # Rotated and rotated back: where one element sets each block's scale, the
            # rotation spreads it and halves the RMS error of 2-bit codes (1.06 -> 0.54 at
            # this size); smooth deltas stay about as small as without it.
            assert errs[("direct", 2, True)] < 0.7 * errs[("direct", 2, False)], errs
            assert errs[("aqsgd", 2, True)] < 1.5 * errs[("aqsgd", 2, False)], errs
        link = Link(peer, SHAPE, bits=2, block=64, rotate=True, tag=500)
        if rank == 0:
            with pytest.raises(ValueError, match="needs finite activations"):
                link.send(torch.full((1, *SHAPE), float("nan")), [0])
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_hadamard_rotation_keeps_caches_identical_and_round_trips(tmp_path):
    run_world(_rotation, 2, tmp_path)


def test_hadamard_transform_is_the_normalized_sylvester_matrix():
    from lowcomm.aqsgd import _hadamard
    h = torch.ones(1, 1)
    while h.shape[0] < 64:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    h = h / 8.0
    eye = torch.eye(64)
    assert torch.allclose(_hadamard(eye.clone(), 64), h @ eye, atol=1e-6)
    v = torch.randn(5, 128)  # runs of 64: two per row
    assert torch.allclose(_hadamard(_hadamard(v.clone(), 64), 64), v, atol=1e-5)
    assert torch.allclose(_hadamard(v.clone(), 64)[:, 64:], v[:, 64:] @ h.T, atol=1e-5)


def _full_cache(rank, world, init_file, errors):
    try:
        dist.init_process_group("lowcomm", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        peer = 1 - rank
        per_sample = SHAPE[0] * SHAPE[1] * 4
        plan = batches(20)  # 12 samples, 4 per step
        for tag, path in ((100, None), (200, f"{init_file}.full{rank}")):
            kw = (dict(cache_budget_bytes=3 * per_sample + 7) if path is None
                  else dict(cache_path=path, capacity=3))
            link = Link(peer, SHAPE, bits=2, tag=tag, **kw)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                for step, ids in enumerate(plan):
                    x = torch.stack([activation(s, step) for s in ids])
                    if rank == 0:
                        link.send(x, ids)
                        link.recv_grad(ids)
                    else:
                        out = link.recv(ids)
                        for i, s in enumerate(ids):
                            if s not in link.cache.slots:  # uncached: exact every time
                                assert torch.equal(out[i], x[i]), (step, s)
                        link.send_grad(0.5 * x, ids)
            assert any("cache is full" in str(w.message) for w in caught), caught
            link.flush()
            link.verify()  # the same 3 samples, the same bits, at both ends
            first3 = list(dict.fromkeys(s for ids in plan for s in ids))[:3]
            assert len(link.cache) == 3 and link.cache.ids() == first3, link.cache.ids()
            assert link.cache.data.shape[0] <= 3  # the budget holds for the allocation too
            assert link.uncached_sends > 0
        # Ends given different budgets: the receiver says so instead of decoding garbage.
        link = Link(peer, SHAPE, bits=2, tag=300,
                    cache_budget_bytes=per_sample if rank == 0 else None)
        x = torch.stack([activation(s, 0) for s in (0, 1)])
        if rank == 0:
            with pytest.warns(UserWarning, match="cache is full"):
                link.send(x, [0, 1])
            link.flush()
        else:
            with pytest.raises(RuntimeError, match="give both the same cache size"):
                link.recv([0, 1])
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_a_full_cache_sends_the_rest_uncached_and_ends_stay_equal(tmp_path):
    run_world(_full_cache, 2, tmp_path)


def test_arguments_refused():
    with pytest.raises(ValueError, match="rotate takes block scales"):
        Link(1, SHAPE, rotate=True, scales="channel")
    with pytest.raises(ValueError, match="rotate takes block scales"):
        Link(1, (3, 5), rotate=True, block=64)
    with pytest.raises(ValueError, match="scales must be"):
        Link(1, SHAPE, scales="row")
    with pytest.raises(ValueError, match="1-bit codes take block scales"):
        Link(1, SHAPE, bits=1, scales="channel")
    with pytest.raises(ValueError, match="8 bits or more"):
        Link(1, SHAPE, backward="q4")
    assert Link(1, SHAPE, backward="q4", allow_low_bit_backward=True).backward == "q4"
    with pytest.raises(ValueError, match="8 bits or more"):
        Link(1, SHAPE, backward="q1", allow_low_bit_backward=True)
    with pytest.raises(ValueError, match="bits must be"):
        Link(1, SHAPE, bits=5)
    with pytest.raises(ValueError, match="capacity"):
        Link(1, SHAPE, cache_path="/tmp/x")
    link = Link(1, SHAPE)
    with pytest.raises(ValueError, match="twice in one micro-batch"):
        link.send(torch.zeros(2, *SHAPE), [3, 3])
    with pytest.raises(ValueError, match="expected a tensor of shape"):
        link.send(torch.zeros(2, 5), [3, 4])
