"""lowcomm.diloco: the outer step uncompressed equals a hand-written DiLoCo step bitwise, and so
does the eager overlapped update (Kale et al. 2025) and Streaming DiLoCo's delayed, merged
fragments (Douillard et al. 2025) and SparseLoCo's rule (top-k + decayed error feedback, no
outer momentum); bad fragment plans and delays are refused; a run
stopped and resumed from state_dict() (compressed, stochastic rounding, error feedback,
overlap, fragments) ends with the same bits as one that never stopped; Gloo groups work
uncompressed; sites running DDP on Gloo inside and DiLoCo on lowcomm between end identical."""
import functools
import sys
import traceback

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from _spawn import run_world

import lowcomm.torch  # noqa: F401
from lowcomm.diloco import DiLoCo


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def inner_step(model, opt, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _reference(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outer = DiLoCo(model, group=lc, sync_every=3)
        lr, mu = 0.7, 0.9
        ref_global, buf = flat(model).clone(), None
        for step in range(9):
            inner_step(model, opt, rank, step)
            if (step + 1) % 3 == 0:
                # Hand-written: every rank's pseudo-gradient, summed in rank order in fp32 and
                # divided by the rank count, then SGD with Nesterov momentum.
                mine = flat(model)
                every = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(every, mine)
                avg = ref_global - every[0]
                for r in range(1, world):
                    avg = avg + (ref_global - every[r])
                avg = avg / world
                buf = avg.clone() if buf is None else buf.mul(mu).add(avg)
                ref_global = ref_global.add(avg.add(buf, alpha=mu), alpha=-lr)
            outer.step()
            if (step + 1) % 3 == 0:
                assert torch.equal(flat(model), ref_global), (step, (flat(model) - ref_global)
                                                              .abs().max())
        # Two steps into a round, finish(): a last outer step over them (no step is lost);
        # a second finish() changes nothing.
        for step in range(9, 11):
            inner_step(model, opt, rank, step)
            outer.step()
        mine = flat(model)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        avg = ref_global - every[0]
        for r in range(1, world):
            avg = avg + (ref_global - every[r])
        avg = avg / world
        buf = buf.mul(mu).add(avg)
        ref_global = ref_global.add(avg.add(buf, alpha=mu), alpha=-lr)
        outer.finish()
        assert torch.equal(flat(model), ref_global), (flat(model) - ref_global).abs().max()
        outer.finish()
        assert torch.equal(flat(model), ref_global)
        # Ranks that ran different step counts: finish() says so instead of hanging.
        odd = DiLoCo(make_model(), group=lc, sync_every=3)
        if rank == 0:
            odd.step()
        with pytest.raises(ValueError, match="every rank must call finish"):
            odd.finish()
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_outer_step_uncompressed_equals_reference_bitwise(tmp_path):
    run_world(_reference, 3, tmp_path)


def _eager_reference(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        outer = DiLoCo(model, group=lc, sync_every=3, overlap="eager")
        lr, mu = 0.7, 0.9
        ref_global, buf, prev_avg, prev_own = flat(model).clone(), None, None, None

        def outer_sgd(g):
            nonlocal buf, ref_global
            buf = g.clone() if buf is None else buf.mul(mu).add(g)
            ref_global = ref_global.add(g.add(buf, alpha=mu), alpha=-lr)

        def rank_order_average(t):
            every = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(every, t)
            avg = every[0]
            for r in range(1, world):
                avg = avg + every[r]
            return avg / world

        for step in range(9):
            inner_step(model, opt, rank, step)
            if (step + 1) % 3 == 0:
                # Hand-written eager update (Kale et al. 2025): this round's own pseudo-gradient,
                # the previous round's average of the others'.
                own = ref_global - flat(model)
                avg = rank_order_average(own)
                outer_sgd(own / world if prev_avg is None else prev_avg + (own - prev_own) / world)
                prev_avg, prev_own = avg, own
            outer.step()
            if (step + 1) % 3 == 0:
                assert torch.equal(flat(model), ref_global), (step, (flat(model) - ref_global)
                                                              .abs().max())
        # The outer states differ by the local terms until finish(): the last round's others,
        # then the exact average of every rank's global parameters.
        mine = ref_global.clone()
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        assert not all(torch.equal(e, mine) for e in every), "eager replicas never differed"
        outer_sgd(prev_avg - prev_own / world)
        final = rank_order_average(ref_global)
        outer.finish()
        assert torch.equal(flat(model), final), (flat(model) - final).abs().max()
        # Refused: a stochastic-rounding codec (this rank's contribution is not known here).
        try:
            DiLoCo(make_model(), group=lc, codec="q4:sr", overlap="eager")
            raise AssertionError("eager with stochastic rounding was accepted")
        except ValueError as e:
            assert "round-to-nearest" in str(e), e
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_eager_overlap_equals_reference_bitwise(tmp_path):
    run_world(_eager_reference, 3, tmp_path)


def _streaming_reference(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        model = make_model()
        params = list(model.parameters())
        plan = [[params[0], params[2]], [params[1], params[3]]]  # strided across depth
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        H, tau, alpha, lr, mu = 4, 2, 0.5, 0.7, 0.9
        outer = DiLoCo(model, group=lc, sync_every=H, fragments=plan, delay=tau,
                       merge_alpha=alpha)

        def get(f):
            return torch.cat([p.detach().reshape(-1) for p in rplan[f]])

        def put(f, flat):
            i = 0
            for p in rplan[f]:
                p.data.copy_(flat[i:i + p.numel()].view_as(p))
                i += p.numel()

        def rank_order_average(t):
            every = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(every, t)
            avg = every[0]
            for r in range(1, world):
                avg = avg + every[r]
            return avg / world

        # Hand-written Streaming DiLoCo on a copy of the model, run beside the real one.
        ref = make_model()
        ref.load_state_dict(model.state_dict())
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        rparams = list(ref.parameters())
        rplan = [[rparams[0], rparams[2]], [rparams[1], rparams[3]]]
        glob = [torch.cat([p.detach().reshape(-1) for p in fr]).clone() for fr in rplan]
        start = [g.clone() for g in glob]
        buf, pending, due, last = [None, None], [None, None], [None, None], [0, 0]
        offsets = [2, 4]
        synced_and_merged = 0
        def outer_sgd(f, avg):
            buf[f] = avg.clone() if buf[f] is None else buf[f].mul(mu).add(avg)
            glob[f] = glob[f].add(avg.add(buf[f], alpha=mu), alpha=-lr)

        for step in range(1, 16):
            inner_step(model, opt, rank, step)
            inner_step(ref, ref_opt, rank, step)
            outer.step()
            for f in range(2):
                if due[f] == step:
                    outer_sgd(f, pending[f])
                    put(f, get(f).mul(alpha).add(glob[f], alpha=1.0 - alpha))
                    start[f] = glob[f].clone()
                    due[f] = None
                    synced_and_merged += 1
            for f in range(2):
                if step >= offsets[f] and (step - offsets[f]) % H == 0:
                    pending[f] = rank_order_average(start[f] - get(f))
                    due[f] = step + tau
                    last[f] = step
            a = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            b = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
            assert torch.equal(a, b), (step, (a - b).abs().max())
        assert synced_and_merged == 6, synced_and_merged
        # finish() at step 15: fragment 0 sent at 14 (due at 16) is applied and merged, then
        # both fragments take a last outer step over the steps since their last send.
        assert due == [16, None] and last == [14, 12], (due, last)
        for f in range(2):
            if due[f] is not None:
                outer_sgd(f, pending[f])
                put(f, get(f).mul(alpha).add(glob[f], alpha=1.0 - alpha))
                start[f] = glob[f].clone()
            outer_sgd(f, rank_order_average(start[f] - get(f)))
        outer.finish()
        for f in range(2):
            assert torch.equal(outer.global_params[f], glob[f]), f
            assert torch.equal(torch.cat([p.detach().reshape(-1) for p in plan[f]]), glob[f])
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_streaming_delay_and_merge_equal_reference_bitwise(tmp_path):
    run_world(_streaming_reference, 3, tmp_path)


@pytest.mark.parametrize("kw, message", [
    (dict(sync_every=4, delay=4), "delay (tau) must be an integer in [0, sync_every 4)"),
    (dict(sync_every=4, delay=-1), "delay (tau) must be"),
    (dict(sync_every=4, delay=1, overlap=True), "alternatives"),
    (dict(sync_every=4, delay=1, merge_alpha=1.5), "merge_alpha must be in [0, 1]"),
    (dict(sync_every=4, fragments="first"), "an int or a list of parameter lists"),
    (dict(sync_every=4, fragments=[[0]]), "not a trainable parameter"),
    (dict(sync_every=4, fragments=[["module"]]), "holds a Linear, not a parameter"),
    (dict(sync_every=4.5, delay=4), "sync_every must be an integer"),
    (dict(sync_every=True), "sync_every must be an integer"),
    (dict(sync_every=4, delay=None), "delay (tau) must be"),
    (dict(sync_every=4, delay=1, merge_alpha=True), "merge_alpha must be in [0, 1]"),
    (dict(sync_every=4, fragments=[["self0"], ["self0", "self1", "self2", "self3"]]),
     "more than one fragment"),
    (dict(sync_every=4, fragments=[["self0", "self1"], ["self2"]]),
     "does not cover every trainable parameter: 1 of 4 missing (indices [3])"),
    (dict(sync_every=4, fragments=[["self0", "self1"], []]), "fragment 1 of the plan is empty"),
    (dict(sync_every=2, fragments=3), "3 fragments need sync_every >= 3"),
    (dict(sync_every=4, fragments=0), "fragments must be in [1, #parameters 4]"),
])
def test_bad_fragment_plans_and_delays_are_refused(kw, message):
    model = make_model()
    params = list(model.parameters())
    if isinstance(kw.get("fragments"), list):
        kw["fragments"] = [[model[0] if x == "module" else params[int(x[4:])]
                            if isinstance(x, str) else torch.zeros(3)
                            for x in frag] for frag in kw["fragments"]]
    with pytest.raises(ValueError) as e:
        DiLoCo(model, **kw)
    assert message in str(e.value), str(e.value)


def _sparseloco_reference(rank, world, init_file, errors):
    try:
        from lowcomm import _C
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        lc = dist.new_group(backend="lowcomm")
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        codec, beta, alpha = "topk:8/128+q3", 0.9, 1.0
        outer = DiLoCo(model, group=lc, sync_every=3, codec=codec, rule="sparseloco",
                       error_feedback_decay=beta, outer_lr=alpha)
        ref_global = flat(model).clone()
        resid = [torch.zeros_like(ref_global) for _ in range(world)]
        for step in range(12):
            inner_step(model, opt, rank, step)
            if (step + 1) % 3 == 0:
                # Hand-written SparseLoCo: every rank's accumulator e = Δ + β·(last e − sent),
                # its top-k sent; the decoded messages summed in rank order in fp32, / P; the
                # outer step θ_g − α·mean, no momentum.
                mine = flat(model)
                every = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(every, mine)
                acc = torch.zeros_like(mine)
                for r in range(world):
                    e = (ref_global - every[r]) + resid[r]
                    sent = torch.empty_like(e)
                    _C.decode(codec, _C.encode(codec, e), sent)
                    resid[r] = (e - sent).mul(beta)
                    acc = acc + sent
                    assert int((sent != 0).sum()) <= 8 * 6  # 676 elements: 5 full chunks + 1
                ref_global = ref_global.add(acc / world, alpha=-alpha)
            outer.step()
            if (step + 1) % 3 == 0:
                assert torch.equal(flat(model), ref_global), (step, (flat(model) - ref_global)
                                                              .abs().max())
                stats = lowcomm.torch.last_op_stats(lc)
                assert 0 < stats["density"] < 0.08, stats
                assert stats["index_bytes_sent"] > 0 and stats["value_bytes_sent"] > 0, stats
        for bad, message in [(dict(codec=None), "needs a lossy codec"),
                             (dict(overlap="eager"), "overlap False"),
                             (dict(codec="q4:decay=0.5"), "error_feedback_decay")]:
            kw = dict(group=lc, sync_every=3, codec=codec, rule="sparseloco")
            kw.update(bad)
            with pytest.raises(ValueError, match=message):
                DiLoCo(make_model(), **kw)
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_sparseloco_equals_reference_bitwise(tmp_path):
    run_world(_sparseloco_reference, 3, tmp_path)


def _train(rank, group, steps, state=None, **kw):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    outer = DiLoCo(model, group=group, **kw)
    start = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        outer.load_state_dict(state["outer"])
        start = state["step"]
    for step in range(start, steps):
        inner_step(model, opt, rank, step)
        outer.step()
    return model, opt, outer


RESUME_CONFIGS = {
    "sender": dict(sync_every=4, codec="q2:sr", error_feedback=True, overlap="delayed",
                   fragments=2),
    "eager": dict(sync_every=4, codec="q2", error_feedback=True, overlap="eager", fragments=2),
    "local": dict(sync_every=4, codec="q2", error_feedback="local", fragments=2),
    "decay": dict(sync_every=4, codec="q2", error_feedback=True, error_feedback_decay=0.5,
                  overlap="delayed"),
    "streaming": dict(sync_every=4, codec="q2:sr", error_feedback=True, fragments=2, delay=2,
                      merge_alpha=0.5),
    "sparseloco": dict(sync_every=4, codec="topk:8/128+q2", rule="sparseloco",
                       error_feedback_decay=0.9, overlap="delayed", fragments=2),
}


def _resume(rank, world, init_file, errors, config="sender"):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        kw = RESUME_CONFIGS[config]
        model, _, outer = _train(rank, dist.new_group(backend="lowcomm"), 22, **kw)
        outer.finish()
        straight = flat(model).clone()
        # Stop at step 13 (mid-round, a fragment's average on the wire), checkpoint, and go on
        # in a fresh group (no residuals of its own) with fresh objects.
        model, opt, outer = _train(rank, dist.new_group(backend="lowcomm"), 13, **kw)
        state = {"model": model.state_dict(), "opt": opt.state_dict(),
                 "outer": outer.state_dict(), "step": 13}
        assert state["outer"]["error_feedback"] or config != "sender"
        model, _, outer = _train(rank, dist.new_group(backend="lowcomm"), 22, state=state, **kw)
        outer.finish()
        assert torch.equal(flat(model), straight), (flat(model) - straight).abs().max()
        # Every rank holds the same global parameters.
        every = [torch.empty_like(straight) for _ in range(world)]
        dist.all_gather(every, straight)
        assert all(torch.equal(e, straight) for e in every)
        # A state of another configuration is refused.
        other = DiLoCo(make_model(), group=dist.new_group(backend="lowcomm"), sync_every=5)
        try:
            other.load_state_dict(state["outer"])
            raise AssertionError("a state of another configuration was accepted")
        except ValueError as e:
            assert "another configuration" in str(e)
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


@pytest.mark.parametrize("config", sorted(RESUME_CONFIGS))
def test_resume_from_state_dict_gives_the_same_bits(tmp_path, config):
    run_world(functools.partial(_resume, config=config), 2, tmp_path)


def _gloo_equals_lowcomm(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        # 2 ranks: a sum of two values does not depend on the order, so Gloo's sum then / 2
        # and lowcomm's average agree bitwise.
        on_gloo, _, o1 = _train(rank, dist.group.WORLD, 8, sync_every=4, overlap=True)
        on_lc, _, o2 = _train(rank, dist.new_group(backend="lowcomm"), 8, sync_every=4,
                              overlap=True)
        o1.finish()
        o2.finish()
        assert torch.equal(flat(on_gloo), flat(on_lc))
        try:
            DiLoCo(make_model(), group=dist.group.WORLD, codec="q4")
            raise AssertionError("a codec on a Gloo group was accepted")
        except ValueError as e:
            assert "lowcomm group" in str(e)
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_runs_uncompressed_on_gloo_too(tmp_path):
    run_world(_gloo_equals_lowcomm, 2, tmp_path)


def _sites(rank, world, init_file, errors):
    try:
        # Two sites of two ranks: DDP on Gloo inside a site, DiLoCo on lowcomm between the
        # ranks holding the same replica position on each site.
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        site_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        cross = [dist.new_group([0, 2], backend="lowcomm"),
                 dist.new_group([1, 3], backend="lowcomm")]
        site, pos = divmod(rank, 2)
        model = DDP(make_model(), process_group=site_groups[site])
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        outer = DiLoCo(model.module, group=cross[pos], sync_every=3, codec="q4",
                       error_feedback=True)
        for step in range(9):
            inner_step(model, opt, 10 * site + pos, step)  # each rank its own data
            outer.step()
        outer.finish()
        mine = flat(model.module)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        assert all(torch.equal(e, mine) for e in every), "replicas differ"
        assert outer.bytes_sent > 0
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_sites_with_ddp_on_gloo_inside_and_diloco_between(tmp_path):
    run_world(_sites, 4, tmp_path)


def _order_keys(rank, world, init_file, errors):
    try:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                                world_size=world)
        opts = lowcomm.torch.Options(codec="q2", codec_threshold=0, error_feedback="order",
                                     direct_bytes=1 << 20)
        by_order = dist.new_group(backend="lowcomm", pg_options=opts)
        named = dist.new_group(backend="lowcomm")
        shapes = [(8, 16), (16,), (16, 16), (16,), (4, 16)]  # (16,) twice within a step
        for step in range(4):
            for i, shape in enumerate(shapes):
                g = torch.Generator().manual_seed(100 * step + 10 * i + rank)
                x = torch.randn(*shape, generator=g)
                a = x.clone()  # a fresh tensor every step, as `p.grad = global - local` is
                dist.all_reduce(a, op=dist.ReduceOp.AVG, group=by_order)
                b = x.clone()
                lowcomm.torch.all_reduce(b, op=dist.ReduceOp.AVG, codec="q2",
                                         error_feedback_key=f"p{i}", group=named)
                assert torch.equal(a, b), (step, i, (a - b).abs().max())
        dist.destroy_process_group()
    except Exception:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        sys.exit(1)


def test_group_error_feedback_by_call_order_matches_named_keys(tmp_path):
    # Both groups one-hop (the named group through LOWCOMM_DIRECT_BYTES), so the two paths
    # quantize the same way and only the residuals' keys could differ.
    import os
    os.environ["LOWCOMM_DIRECT_BYTES"] = str(1 << 20)
    try:
        run_world(_order_keys, 2, tmp_path)
    finally:
        del os.environ["LOWCOMM_DIRECT_BYTES"]
