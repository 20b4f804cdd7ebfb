"""DiLoCo's outer step over a lowcomm group: H inner steps apart, sites average a compressed
pseudo-gradient and take one outer Nesterov step.

    import lowcomm.torch, lowcomm.diloco
    sites = dist.new_group(ranks, backend="lowcomm")        # one rank per site
    outer = lowcomm.diloco.DiLoCo(model, group=sites, sync_every=500, codec="q4")
    for batch in data:
        loss(model, batch).backward(); inner_opt.step(); inner_opt.zero_grad()
        outer.step()                      # every sync_every calls: the outer step
    outer.finish()                        # the model holds the global parameters

The algorithm (Douillard et al. 2023; the OpenDiLoCo trainers): every worker keeps the global
parameters θ_g (fp32, identical everywhere) and trains its own copy θ from them. Every H inner
steps, Δ = θ_start − θ (θ_start: where this round began) is averaged over the group (compressed,
with optional error feedback), the outer optimizer (SGD, lr 0.7, momentum 0.9, Nesterov by
default) steps θ_g with Δ̄ as its gradient, and θ ← θ_g.

overlap: the average of round t travels while round t+1 trains, so the link has H inner steps
to move a round. overlap=True or "delayed" (the best measured here, docs/training.md): at the
end of round t+1 the average of round t is applied to θ_g, and θ ← θ_g − Δ_{t+1} (the newest
global parameters plus this worker's own progress still on the wire). overlap="eager" (Kale,
Douillard, Donchev 2025, "Eager Updates for
Overlapped Communication and Computation in DiLoCo"): at the end of round t each worker feeds
its outer optimizer, where the average would go, Δ̄(t−1) + (Δ_m(t) − Δ_m(t−1))/M — the others'
contributions of the previous round and its own of this one (its own as it entered the
reduction: decoded), then θ ← θ_g. The outer states then differ by the local term; finish()
applies the last average and makes every rank's θ_g their exact average (one uncompressed
all-reduce of the parameters), so the replicas end identical. In the measured harness (4
workers, H 50, 6 outer steps) it oscillates and ends far worse than the delayed update.

fragments=F (Streaming DiLoCo, Douillard et al. 2025): the parameters, in order, are cut into
F fragments of about equal size (or fragments= a list of parameter lists, any plan that holds
every trainable parameter once, e.g. strided across depth); fragment f synchronises at steps
(f+1)·H/F + kH, so at most 1/F of the model is on the wire at once. Each fragment is an
independent DiLoCo with its own round and outer state. delay=τ (0 < τ < H): a fragment's
average is sent at its sync step and applied τ inner steps later, overlapping τ steps: the
outer step is taken from the global parameters the round started from, and the fragment's
parameters become α·θ_local + (1 − α)·θ_g (merge_alpha=α; 0 drops the τ local steps, 0.5
keeps half of them). The next round's pseudo-gradient is measured from θ_g, so what the merge
kept of the local steps is sent with it.

Each rank's own contribution is quantized with `codec`; error feedback keeps what its
quantization lost (one residual per fragment, in lowcomm's error-feedback store) and adds it to
the next round's Δ. state_dict() holds the global parameters, round starts, outer optimizer,
pending averages and residuals: resuming reproduces the bits of an uninterrupted run.
The inner model may be DDP/FSDP on a site's own group (NCCL, Gloo): give DiLoCo the module
whose parameters this rank holds, and a group of the ranks holding the same ones on the other
sites.

A CUDA model keeps its outer state on its device: θ_g, θ_start, the outer optimizer's momentum,
pending averages and DiLoCo's own residuals live where each fragment's parameters do, and the
averages take the backend's CUDA path (compressed ones encoded on the GPU); every rank ends with
the same bits as with a CPU model, as far as the bits depend on lowcomm (torch's own outer
optimizer may round differently on the GPU).

group may be a lowcomm.elastic.ElasticGroup: workers may then die, freeze and join. A round that
loses a worker completes with the survivors (the library retries it in the new view; nobody's
inner steps are thrown away), and the global parameters, the outer momentum and the round count
are registered with the group, so every commit checks that the replicas hold the same ones and a
joiner fetches them: a joiner calls catch_up() once (its first round contributes nothing and
ends with the group's state), then trains as the others. Elastic groups take fragments=1,
overlap=False and the built-in outer SGD.
"""
import time

import torch
import torch.distributed as dist

from lowcomm import _C
from lowcomm import elastic as lowcomm_elastic
from lowcomm import torch as lowcomm_torch


def _is_lowcomm(group):
    try:
        lowcomm_torch._backend(group)
        return True
    except RuntimeError:
        return False


class DiLoCo:
    """The outer loop of DiLoCo around any model and inner optimizer (see the module doc).

    model: the nn.Module trained by the inner optimizer (its trainable parameters are synced).
    group: the process group of the sites (default: the world); compressed averages need a
      lowcomm group, codec=None works on any backend (e.g. to compare with Gloo).
    sync_every: H, the inner steps between outer steps (per fragment).
    outer_lr, outer_momentum, nesterov: the outer SGD; outer_optimizer: instead, a function
      from a list of tensors to a torch.optim.Optimizer.
    codec: lowcomm codec of the pseudo-gradient ("q4", "q2:block=64", "q4:sr", ...; None/"none"
      exact). error_feedback: True / "sender": keep each rank's quantization error of its
      contribution and add it to the next round's pseudo-gradient; "both": also the error of
      the owners' re-quantization of the average; "local": leave it in this rank's own model
      (θ ← θ_g − error), so the next pseudo-gradient carries it without the inner steps
      redoing it (docs/training.md compares them). error_feedback_decay: scale the kept error
      by this factor (the residual then lives here, not in lowcomm's store).
    overlap: average round t while round t+1 trains: True or "delayed" (the delayed update),
      or "eager" (the eager update); False: no overlap.
    fragments: synchronise F slices of the parameters at staggered steps; an int (contiguous
      slices of about equal size) or a list of lists of the model's trainable parameters.
    delay: τ, the inner steps between sending a fragment's average and applying it (Streaming
      DiLoCo; 0: apply at once). merge_alpha: α of the merge after a delayed outer step.
    rule: "diloco" (the outer optimizer above) or "sparseloco" (SparseLoCo: no outer momentum,
      θ_g ← θ_g − outer_lr · mean of the decoded messages, outer_lr 1 by default; each rank's
      error-feedback accumulator e ← β·e + Δ in lowcomm's store, β = error_feedback_decay,
      0.95 by default; meant for a sparse codec such as "topk:64/4096+q2", any lossy codec
      works; outer_momentum and nesterov do not apply). Not with overlap="eager" or an elastic
      group.
    """

    def __init__(self, model, *, group=None, sync_every=500, outer_lr=None, outer_momentum=0.9,
                 nesterov=True, outer_optimizer=None, codec=None, error_feedback=False,
                 overlap=False, fragments=1, error_feedback_decay=None, delay=0,
                 merge_alpha=0.5, rule="diloco", name="diloco"):
        if isinstance(sync_every, bool) or not isinstance(sync_every, (int, float)) or \
                int(sync_every) != sync_every or sync_every < 1:
            raise ValueError(f"lowcomm.diloco: sync_every must be an integer >= 1, got "
                             f"{sync_every!r}")
        sync_every = int(sync_every)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("lowcomm.diloco: the model has no trainable parameters")
        plan = _plan(self.params, fragments)
        if len(plan) > sync_every:
            raise ValueError(f"lowcomm.diloco: {len(plan)} fragments need sync_every >= "
                             f"{len(plan)}, got {sync_every}")
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or \
                int(delay) != delay or not 0 <= delay < sync_every:
            raise ValueError(f"lowcomm.diloco: delay (tau) must be an integer in [0, sync_every "
                             f"{sync_every}), got {delay!r}")
        self.delay = int(delay)
        if isinstance(merge_alpha, bool) or not isinstance(merge_alpha, (int, float)) or \
                not 0.0 <= merge_alpha <= 1.0:
            raise ValueError(f"lowcomm.diloco: merge_alpha must be in [0, 1], got {merge_alpha}")
        self.merge_alpha = float(merge_alpha)
        if self.delay and overlap:
            raise ValueError("lowcomm.diloco: delay (Streaming DiLoCo) and overlap are "
                             "alternatives: overlap applies the average a whole round later")
        if self.delay and error_feedback == "local":
            raise ValueError("lowcomm.diloco: error_feedback='local' is not defined with delay")
        self.group = group
        self.sync_every = int(sync_every)
        self.codec = "" if codec in (None, "", "none", "fp32") else codec
        if rule not in ("diloco", "sparseloco"):
            raise ValueError(f"lowcomm.diloco: rule must be 'diloco' or 'sparseloco', got {rule!r}")
        self.rule = rule
        if rule == "sparseloco":
            # SparseLoCo: the decayed accumulator lives in lowcomm's error-feedback store (the
            # codec's decay= option), the outer step is plain SGD without momentum.
            if not self.codec or self.codec.split(":")[0] in ("bf16", "fp16"):
                raise ValueError("lowcomm.diloco: rule='sparseloco' needs a lossy codec, e.g. "
                                 "'topk:64/4096+q2'")
            if outer_optimizer is not None or error_feedback not in (False, True, None, "sender"):
                raise ValueError("lowcomm.diloco: rule='sparseloco' sets the outer step and the "
                                 "error feedback itself (no outer_optimizer, error_feedback True)")
            if overlap == "eager" or isinstance(group, lowcomm_elastic.ElasticGroup):
                raise ValueError("lowcomm.diloco: rule='sparseloco' takes overlap False, True or "
                                 "'delayed' and a process group (not an elastic one)")
            beta = 0.95 if error_feedback_decay is None else float(error_feedback_decay)
            if not 0.0 <= beta <= 1.0:
                raise ValueError(f"lowcomm.diloco: error_feedback_decay must be in [0, 1], "
                                 f"got {beta}")
            if ":decay=" in self.codec:
                raise ValueError("lowcomm.diloco: rule='sparseloco' takes the decay as "
                                 "error_feedback_decay, not in the codec")
            self.codec = f"{self.codec}:decay={beta!r}"
            error_feedback, error_feedback_decay = True, None
            outer_momentum, nesterov = 0.0, False
            if outer_lr is None:
                outer_lr = 1.0
        if outer_lr is None:
            outer_lr = 0.7
        if error_feedback not in (False, True, None, "sender", "both", "local"):
            raise ValueError(f"lowcomm.diloco: error_feedback must be False, True (= 'sender'), "
                             f"'both' or 'local', got {error_feedback!r}")
        self.error_feedback = bool(error_feedback)
        self.owner_error_feedback = error_feedback == "both"
        self.local_error_feedback = error_feedback == "local"
        if overlap not in (False, True, None, "eager", "delayed"):
            raise ValueError(f"lowcomm.diloco: overlap must be False, True (= 'delayed'), "
                             f"'delayed' or 'eager', got {overlap!r}")
        self.overlap_mode = "delayed" if overlap is True else (overlap or "")
        if self.local_error_feedback and overlap:
            raise ValueError("lowcomm.diloco: error_feedback='local' is not defined with overlap")
        if self.overlap_mode == "eager" and (error_feedback == "both" or ":sr" in (codec or "")):
            # The eager rule subtracts this rank's contribution as it entered the reduction,
            # computed here: round to nearest, and the sender's error only.
            raise ValueError("lowcomm.diloco: overlap='eager' takes a round-to-nearest codec and "
                             "error_feedback False or True")
        if self.error_feedback and not self.codec:
            raise ValueError("lowcomm.diloco: error_feedback needs a lossy codec")
        self.ef_decay = None if error_feedback_decay is None else float(error_feedback_decay)
        if self.local_error_feedback and self.ef_decay is None:
            self.ef_decay = 1.0
        if (self.overlap_mode == "eager" and self.error_feedback and self.ef_decay is None):
            self.ef_decay = 1.0  # the residual kept here: the eager rule needs what was sent
        if self.ef_decay is not None:
            if error_feedback not in (True, "sender", "local") or ":sr" in self.codec:
                raise ValueError("lowcomm.diloco: error_feedback_decay needs error_feedback="
                                 "True and a round-to-nearest codec")
            if not 0.0 <= self.ef_decay <= 1.0:
                raise ValueError(f"lowcomm.diloco: error_feedback_decay must be in [0, 1], "
                                 f"got {self.ef_decay}")
        self.elastic = isinstance(group, lowcomm_elastic.ElasticGroup)
        if self.elastic and (len(plan) != 1 or overlap or self.delay
                             or outer_optimizer is not None
                             or error_feedback in ("both", "local")
                             or error_feedback_decay is not None):
            raise ValueError("lowcomm.diloco: an elastic group takes fragments=1, overlap=False, "
                             "delay=0, the built-in outer SGD and error_feedback False or True")
        self.on_lowcomm = not self.elastic and _is_lowcomm(group)
        if self.codec and not self.on_lowcomm and not self.elastic:
            raise ValueError("lowcomm.diloco: a codec needs a lowcomm group "
                             "(dist.new_group(backend='lowcomm'))")
        self.overlap = bool(self.overlap_mode)
        self.name = name
        self.world = group.size() if self.elastic else dist.get_world_size(group)
        self.inner_steps = 0
        self.plan = plan  # per fragment: indices into self.params
        self.fragments = [[self.params[i] for i in idx] for idx in plan]
        fragments = len(plan)
        self.offsets = [(f + 1) * self.sync_every // fragments for f in range(fragments)]
        self.global_params = []  # per fragment: fp32 flat θ_g
        self.starts = []         # per fragment: fp32 flat θ_start of the current round
        # The outer state lives where the fragment's parameters do (CPU or one CUDA device;
        # its first parameter's device): the averages are then the library's device path, and
        # a CUDA model's global parameters never leave the GPU.
        self.devices = [frag[0].device for frag in self.fragments]
        for frag, dev in zip(self.fragments, self.devices):
            flat = torch.cat([p.detach().reshape(-1).to(dev, torch.float32) for p in frag])
            self.global_params.append(flat)
            self.starts.append(flat.clone())
        self.rounds = [0] * fragments          # outer steps taken per fragment
        self.synced_at = [0] * fragments       # the inner step of each fragment's last sync
        # error_feedback_decay: the residuals kept here (the core's store keeps them otherwise)
        self.residuals = ([torch.zeros_like(g) for g in self.global_params]
                          if self.ef_decay is not None and not self.local_error_feedback
                          else None)
        self.pending = [None] * fragments      # overlap, delay: (lowcomm Work or None, buffer)
        self.due = [None] * fragments          # delay: the inner step to apply pending at
        self.own_sent = [None] * fragments     # eager: this rank's last contribution, decoded
        if outer_optimizer is None:
            self.outer = torch.optim.SGD(self.global_params, lr=outer_lr,
                                         momentum=outer_momentum, nesterov=nesterov)
        else:
            self.outer = outer_optimizer(self.global_params)
        self.comm_wait_s = 0.0
        self.bytes_sent = 0
        self.last_stats = None
        if self.elastic:
            self._register_elastic_state()

    def _register_elastic_state(self):
        """What a joiner needs and every commit checks: θ_g, the outer momentum (created now, as
        zeros: SGD's first step then gives the same buffer as creating it from the gradient), and
        the round count."""
        g = self.global_params[0]
        self.group.register_state(f"{self.name}/global", g)
        if self.outer.defaults.get("momentum", 0):
            buf = self.outer.state[g].setdefault("momentum_buffer", torch.zeros_like(g))
            self.group.register_state(f"{self.name}/momentum", buf)
        self._round_t = torch.zeros(1, dtype=torch.int64)
        self.group.register_state(f"{self.name}/rounds", self._round_t)

    @torch.no_grad()
    def catch_up(self):
        """A joiner's first round, at once: it contributes nothing, receives the group's global
        parameters, outer state and round count with the round's average, and takes the same
        outer step as everyone; its model then holds θ_g and it trains in step with the others
        (the next outer step after sync_every more inner steps)."""
        if not self.elastic or not self.group.fresh:
            raise ValueError("lowcomm.diloco: catch_up is for a joiner of an elastic group, "
                             "before its first round")
        self._sync(0)
        self.inner_steps = 0

    # -- the training loop's calls ------------------------------------------------------------

    @torch.no_grad()
    def step(self):
        """Call once after every inner optimizer step. Returns the fragments synchronised."""
        self.inner_steps += 1
        for f, due in enumerate(self.due):
            if due is not None and self.inner_steps >= due:
                self._apply_delayed(f)
        done = []
        for f, off in enumerate(self.offsets):
            if self.inner_steps >= off and (self.inner_steps - off) % self.sync_every == 0:
                self._sync(f)
                done.append(f)
        return done

    @torch.no_grad()
    def finish(self):
        """Apply every average still on the wire, take a last outer step for every fragment
        trained since its last sync (a short round: with fragments, or a step count that is
        not a multiple of sync_every, no inner step is lost; every rank must call it after
        the same number of steps), and load the global parameters into the model (what every
        rank then holds bit for bit). Eager overlap and elastic groups (whose members leave
        when they like) drop the progress of a short last round."""
        short_rounds = not self.elastic and self.overlap_mode != "eager"
        if short_rounds:
            self._check_same_steps()
        for f in range(len(self.fragments)):
            if self.delay and self.pending[f] is not None:
                self._apply_delayed(f)  # the merge too: the short round starts from θ_g
            self._apply_pending(f)
            if self.overlap_mode == "eager":
                self._equalize(f)
            elif short_rounds and self.inner_steps > self.synced_at[f]:
                self._sync(f)
                self._apply_pending(f)
            self.starts[f].copy_(self.global_params[f])
            self._load(f, self.global_params[f])

    def _check_same_steps(self):
        """finish()'s short rounds are collectives only ranks with progress would start: every
        rank must have run the same inner steps (one small all-reduce says so, or why not)."""
        t = torch.tensor([self.inner_steps, -self.inner_steps], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        if int(t[0]) != -int(t[1]):
            raise ValueError(f"lowcomm.diloco: finish() after {self.inner_steps} inner steps "
                             f"here, while the group's ranks ran from {-int(t[1])} to "
                             f"{int(t[0])}: every rank must call finish() after the same "
                             "number of step() calls")

    def _last_scheduled_sync(self, f):
        """The inner step at which fragment f last synchronised on schedule (0: never)."""
        off = self.offsets[f]
        if self.inner_steps < off:
            return 0
        return self.inner_steps - (self.inner_steps - off) % self.sync_every

    # -- one fragment's outer step ------------------------------------------------------------

    def _sync(self, f):
        self.synced_at[f] = self.inner_steps
        progress = self.starts[f] - self._flat(f)  # Δ = θ_start − θ, fp32
        key = f"{self.name}/frag{f}" if self.error_feedback else ""
        delta = progress
        lost = None
        sent = None
        if self.local_error_feedback:
            # Implicit error feedback (as CocktailSGD's workers): what this rank's quantization
            # loses stays in its own model, θ ← θ_g − lost, and the next Δ = θ_g − θ carries it
            # with the progress made from there; the inner steps do not redo (and so double)
            # the unsent part of a displacement, as an explicit residual added to Δ would.
            sent = torch.empty_like(delta)
            _C.decode(self.codec, _C.encode(self.codec, delta), sent)
            lost = (delta - sent).mul_(self.ef_decay)
            key = ""
        elif self.residuals is not None:
            # What this rank's quantization will lose, computed as lowcomm will quantize it
            # (block codecs: owner chunks start on block boundaries, so the bits agree), kept
            # scaled by the decay for the next round.
            delta = progress + self.residuals[f]
            sent = torch.empty_like(delta)
            _C.decode(self.codec, _C.encode(self.codec, delta), sent)
            self.residuals[f] = (delta - sent).mul_(self.ef_decay)
            key = ""
        step = self.rounds[f] * len(self.fragments) + f  # stochastic rounding: resumable
        if self.elastic:
            self._round_t[0] = self.rounds[f]  # the registered count: as of the last commit
        self.rounds[f] += 1
        if self.overlap_mode == "eager":
            self._sync_eager(f, delta, key, step, sent)
            return
        if self.delay:
            # Streaming DiLoCo: τ more inner steps from here, then _apply_delayed.
            self.pending[f] = (self._launch(delta, key, step), delta)
            self.due[f] = self.inner_steps + self.delay
            return
        if not self.overlap:
            self._wait(self._launch(delta, key, step))
            self._outer_step(f, delta)
            self.starts[f].copy_(self.global_params[f])
            self._load(f, self.global_params[f] if lost is None else self.global_params[f] - lost)
            return
        self._apply_pending(f)
        new_start = self.global_params[f] - progress  # the newest θ_g plus own unsent progress
        self.starts[f].copy_(new_start)
        self._load(f, new_start)
        self.pending[f] = (self._launch(delta, key, step), delta)

    def _apply_delayed(self, f):
        """Streaming DiLoCo, τ steps after the send: the outer step from the round's θ_g, then
        θ ← α·θ_local + (1 − α)·θ_g, and the next round is measured from θ_g."""
        self._apply_pending(f)
        g = self.global_params[f]
        merged = self._flat(f).mul_(self.merge_alpha).add_(g, alpha=1.0 - self.merge_alpha)
        self.starts[f].copy_(g)
        self._load(f, merged)

    def _sync_eager(self, f, delta, key, step, sent):
        """The eager update (module doc): own contribution of this round, the others' of the
        previous one; the all-reduce of this round is consumed at the next. `sent`: delta as
        this rank's quantization leaves it, when _sync has computed it."""
        if sent is not None:
            own = sent
        elif self.codec:
            own = torch.empty_like(delta)
            _C.decode(self.codec, _C.encode(self.codec, delta), own)
        else:
            own = delta.clone()
        work = self._launch(delta, key, step)
        if self.pending[f] is None:
            grad = own / self.world
        else:
            prev_work, prev_avg = self.pending[f]
            if prev_work is not None:
                self._wait(prev_work)
            grad = prev_avg + (own - self.own_sent[f]) / self.world
        self._outer_step(f, grad)
        self.starts[f].copy_(self.global_params[f])
        self._load(f, self.global_params[f])
        self.pending[f] = (work, delta)
        self.own_sent[f] = own

    def _equalize(self, f):
        """Eager: every rank's θ_g becomes their exact average (the replicas differ by the local
        terms until then)."""
        g = self.global_params[f]
        if self.elastic:
            raise ValueError("lowcomm.diloco: eager overlap is not for elastic groups")
        if self.on_lowcomm:
            dist.all_reduce(g, op=dist.ReduceOp.AVG, group=self.group)
        else:
            dist.all_reduce(g, group=self.group)
            g.div_(self.world)

    def _launch(self, delta, key, step):
        """Start averaging delta in place over the group; returns its work."""
        if self.elastic:
            fresh = self.group.fresh
            t0 = time.perf_counter()
            self.group.all_reduce(delta, average=True, codec=self.codec, error_feedback_key=key)
            self.comm_wait_s += time.perf_counter() - t0
            if fresh:  # a joiner: the round count came with the fetched state
                self.rounds[0] = int(self._round_t[0]) + 1
            self.world = self.group.size()
            return None
        if not self.codec:
            # Exact: lowcomm averages (fp32 sum in rank order, then / P); other backends (Gloo
            # has no AVG) sum, and _wait divides.
            op = dist.ReduceOp.AVG if self.on_lowcomm else dist.ReduceOp.SUM
            work = dist.all_reduce(delta, op=op, group=self.group, async_op=True)
            return work if self.on_lowcomm else _DivideAfter(work, delta, self.world)
        return lowcomm_torch.all_reduce(delta, op=dist.ReduceOp.AVG, codec=self.codec,
                                        error_feedback_key=key, group=self.group,
                                        async_op=True, step=step,
                                        owner_error_feedback=self.owner_error_feedback)

    def _apply_pending(self, f):
        if self.pending[f] is None:
            return
        work, avg = self.pending[f]
        if work is not None:
            self._wait(work)
        self.pending[f] = None
        self.due[f] = None
        if self.overlap_mode == "eager":
            # The last round: the others' contributions (this rank's own went in already).
            self._outer_step(f, avg - self.own_sent[f] / self.world)
            self.own_sent[f] = None
            return
        self._outer_step(f, avg)

    def _wait(self, work):
        if work is None:  # an elastic group's all-reduce, complete when it returned
            return
        t0 = time.perf_counter()
        work.wait()
        self.comm_wait_s += time.perf_counter() - t0
        if self.on_lowcomm:
            # The group's last completed operation: this average when nothing else ran on the
            # group since (give DiLoCo a group of its own for exact byte counts with overlap).
            self.last_stats = lowcomm_torch.last_op_stats(self.group)
            self.bytes_sent += int(self.last_stats["bytes_sent"])

    @torch.no_grad()
    def load_global(self, module):
        """Copy the global parameters (what finish() leaves in every rank's model) into
        `module`, a model of the same architecture, e.g. to evaluate them mid-training."""
        params = [p for p in module.parameters() if p.requires_grad]
        if [p.shape for p in params] != [p.shape for p in self.params]:
            raise ValueError("lowcomm.diloco: load_global needs a module shaped like the model")
        for f, idx in enumerate(self.plan):
            j = 0
            for i in idx:
                p = params[i]
                p.copy_(self.global_params[f][j:j + p.numel()].view_as(p))
                j += p.numel()

    def _outer_step(self, f, avg):
        g = self.global_params[f]
        g.grad = avg
        self.outer.step()
        g.grad = None

    def _flat(self, f):
        return torch.cat([p.detach().reshape(-1).to(self.devices[f], torch.float32)
                          for p in self.fragments[f]])

    def _load(self, f, flat):
        i = 0
        for p in self.fragments[f]:
            n = p.numel()
            p.copy_(flat[i:i + n].view_as(p))
            i += n

    # -- checkpoints --------------------------------------------------------------------------

    @torch.no_grad()
    def state_dict(self):
        """Everything besides the model and the inner optimizer that a resumed run needs to
        continue bit for bit: waits for averages on the wire (their results are saved)."""
        pending = []
        for f in range(len(self.fragments)):
            if self.pending[f] is None:
                pending.append(None)
                continue
            work, avg = self.pending[f]
            if work is not None:
                self._wait(work)
            self.pending[f] = (None, avg)
            pending.append(avg.clone())
        ef = b""
        if self.error_feedback:
            ef = lowcomm_torch._backend(self.group).save_error_feedback()
        return {
            "version": 1,
            "config": self._config(),
            "inner_steps": self.inner_steps,
            "rounds": list(self.rounds),
            "due": list(self.due),
            "synced_at": list(self.synced_at),
            "global_params": [g.clone() for g in self.global_params],
            "starts": [s.clone() for s in self.starts],
            "pending": pending,
            "outer_optimizer": self.outer.state_dict(),
            "error_feedback": ef,
            "residuals": None if self.residuals is None else [r.clone() for r in self.residuals],
            "own_sent": [None if o is None else o.clone() for o in self.own_sent],
        }

    @torch.no_grad()
    def load_state_dict(self, state):
        if state.get("version") != 1:
            raise ValueError(f"lowcomm.diloco: unknown state version {state.get('version')}")
        saved = dict(state["config"])
        if "plan" not in saved:  # a state from before plans and delays: contiguous, no delay
            try:
                saved["plan"] = _plan(self.params, len(saved["sizes"]))
            except ValueError:
                saved["plan"] = None
            saved.setdefault("delay", 0)
            saved.setdefault("merge_alpha", None)
        if saved != self._config():
            raise ValueError(f"lowcomm.diloco: the state is of another configuration: saved "
                             f"{state['config']}, this one {self._config()}")
        for f in range(len(self.fragments)):
            if self.pending[f] is not None and self.pending[f][0] is not None:
                self._wait(self.pending[f][0])
        self.inner_steps = int(state["inner_steps"])
        self.rounds = list(state["rounds"])
        for dst, src in zip(self.global_params, state["global_params"]):
            dst.copy_(src)
        for dst, src in zip(self.starts, state["starts"]):
            dst.copy_(src)
        self.pending = [None if p is None else (None, p.clone()) for p in state["pending"]]
        self.due = list(state.get("due", [None] * len(self.fragments)))
        self.synced_at = list(state.get("synced_at", [self._last_scheduled_sync(f)
                                                      for f in range(len(self.fragments))]))
        self.own_sent = [None if o is None else o.clone()
                         for o in state.get("own_sent", [None] * len(self.fragments))]
        self.outer.load_state_dict(state["outer_optimizer"])
        if self.residuals is not None:
            for dst, src in zip(self.residuals, state["residuals"]):
                dst.copy_(src)
        if self.error_feedback and state["error_feedback"]:
            lowcomm_torch._backend(self.group).restore_error_feedback(state["error_feedback"])

    def _config(self):
        return {
            "sizes": [int(g.numel()) for g in self.global_params],
            "sync_every": self.sync_every,
            "codec": self.codec,
            "error_feedback": self.error_feedback,
            "owner_error_feedback": self.owner_error_feedback,
            "local_error_feedback": self.local_error_feedback,
            "error_feedback_decay": self.ef_decay,
            "overlap": self.overlap_mode,
            "plan": [list(idx) for idx in self.plan],
            "delay": self.delay,
            "merge_alpha": self.merge_alpha if self.delay else None,
            "world": self.world,
            # Only when not the default, so states of rule="diloco" load in earlier versions.
            **({"rule": self.rule} if self.rule != "diloco" else {}),
        }


class _DivideAfter:
    """A sum's work that turns the sum into the average once complete."""

    def __init__(self, work, buf, n):
        self.work, self.buf, self.n = work, buf, n

    def wait(self):
        self.work.wait()
        self.buf.div_(self.n)


def _plan(params, fragments):
    """The fragments as lists of indices into params: an int cuts params in order into runs of
    about equal element count; a list of parameter lists must hold every one exactly once."""
    if isinstance(fragments, bool) or not isinstance(fragments, (int, list, tuple)):
        raise ValueError(f"lowcomm.diloco: fragments must be an int or a list of parameter "
                         f"lists, got {fragments!r}")
    if isinstance(fragments, int):
        if not 1 <= fragments <= len(params):
            raise ValueError(f"lowcomm.diloco: fragments must be in [1, #parameters "
                             f"{len(params)}], got {fragments}")
        plan, i = [], 0
        for frag in _cut(params, fragments):
            plan.append(list(range(i, i + len(frag))))
            i += len(frag)
        return plan
    where = {id(p): i for i, p in enumerate(params)}
    plan, seen = [], set()
    for f, frag in enumerate(fragments):
        frag = list(frag)
        if not frag:
            raise ValueError(f"lowcomm.diloco: fragment {f} of the plan is empty")
        idx = []
        for p in frag:
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"lowcomm.diloco: fragment {f} holds a {type(p).__name__}, "
                                 f"not a parameter (give lists of parameters, e.g. "
                                 f"list(block.parameters()))")
            i = where.get(id(p))
            if i is None:
                raise ValueError(f"lowcomm.diloco: fragment {f} holds a tensor that is not a "
                                 f"trainable parameter of the model (shape {tuple(p.shape)})")
            if i in seen:
                raise ValueError(f"lowcomm.diloco: parameter {i} (shape "
                                 f"{tuple(params[i].shape)}) is in more than one fragment")
            seen.add(i)
            idx.append(i)
        plan.append(idx)
    missing = [i for i in range(len(params)) if i not in seen]
    if missing:
        raise ValueError(f"lowcomm.diloco: the fragment plan does not cover every trainable "
                         f"parameter: {len(missing)} of {len(params)} missing (indices "
                         f"{missing[:8]}{'...' if len(missing) > 8 else ''})")
    return plan


def _cut(params, n):
    """Parameters in order, cut into n runs of about equal element count (none empty)."""
    total = sum(p.numel() for p in params)
    frags, cur, acc = [], [], 0
    for i, p in enumerate(params):
        cur.append(p)
        acc += p.numel()
        left_params = len(params) - i - 1
        left_frags = n - len(frags) - 1
        if left_frags > 0 and (acc >= total * (len(frags) + 1) / n or left_params == left_frags):
            frags.append(cur)
            cur = []
    frags.append(cur)
    return frags

