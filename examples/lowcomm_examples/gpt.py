"""A small decoder-only byte-level GPT for the training examples.

Vocabulary 256 (bytes), learned position embeddings, pre-LayerNorm blocks of causal
self-attention (``torch.nn.functional.scaled_dot_product_attention``) and a GELU MLP, a final
LayerNorm and a linear head, optionally tied to the token embedding. Initialisation is a pure
function of a seed (GPT-2 style: N(0, 0.02), residual output projections scaled by
1/sqrt(2 n_layer)), so every DiLoCo worker and both pipeline stages can build the same weights
without communicating.

``split_stages`` cuts the model into pipeline stages that share the model's parameters:
stage 0 is the embeddings and the first blocks and returns the hidden state [B, T, d], the
last stage is the remaining blocks, the final LayerNorm and the head and returns logits.
Running the stages one after the other performs exactly the operations of ``GPT.forward``, so
the logits are bitwise equal.

Sizes, chosen for a 2-core machine. Measured: one training step of batch 16 x seq 128
(forward, backward, AdamW; median of 30 after 5 warm-up steps) on 1 thread, torch 2.15 CPU, on
the shared 2-core development machine at load average 1.3 to 3.8, so the spread is contention;
``cd examples && python -m lowcomm_examples.gpt`` prints them:

* ``QUICK``: 2 layers, 2 heads, d_model 48: 87 k parameters, 32 to 43 ms per step;
* ``FULL``: 4 layers, 2 heads, d_model 96: 509 k parameters, 131 to 161 ms per step (about 4x
  the step time of ``QUICK``; 5.8x the parameters, but attention, loss and per-operation
  overheads do not grow with the width).

Two heads rather than four: PyTorch's CPU attention is slow for small heads; at d_model 48 the
step took 45.7 ms with four heads and 37.4 ms with two (same parameters). With ``QUICK``, 200
AdamW steps (lr 3e-3) take the validation loss from 5.55 to about 2.46 nats/byte,
below the 3.16 of byte frequencies alone (examples/tests/test_common.py).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 2
    n_head: int = 2
    d_model: int = 48
    seq: int = 128  # longest sequence (size of the position table)
    # Off by default: a tied head shares a weight between the first and the last pipeline
    # stage, which separate processes would have to keep in sync.
    tie_weights: bool = False

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} not divisible by n_head {self.n_head}")


QUICK = GPTConfig(n_layer=2, n_head=2, d_model=48, seq=128)
FULL = GPTConfig(n_layer=4, n_head=2, d_model=96, seq=128)


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.fc_out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, t, d = h.shape
        q, k, v = self.qkv(self.ln1(h)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return h + self.fc_out(F.gelu(self.fc(self.ln2(h))))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig = QUICK, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(VOCAB, cfg.d_model)
        self.wpe = nn.Embedding(cfg.seq, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, VOCAB, bias=False)
        if cfg.tie_weights:
            self.head.weight = self.wte.weight
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """GPT-2 initialisation drawn from one generator seeded with ``seed``, in
        ``named_parameters`` order (fixed by the module structure)."""
        g = torch.Generator().manual_seed(seed)
        resid_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_"):
                p.fill_(1.0)
            elif name.endswith("proj.weight") or name.endswith("fc_out.weight"):
                p.normal_(0.0, resid_std, generator=g)
            else:
                p.normal_(0.0, 0.02, generator=g)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)
        return self.wte(x) + self.wpe(pos)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits [B, T, 256] for input bytes ``x`` (int64 [B, T], T <= cfg.seq)."""
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class Stage(nn.Module):
    """One pipeline stage of a GPT: optionally the embeddings, some blocks, optionally the
    final LayerNorm and head. Holds the model's own modules (parameters are shared)."""

    def __init__(self, model: GPT, blocks: list[Block], first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe = model.wte, model.wpe
        self.blocks = nn.ModuleList(blocks)
        if last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            h = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
        else:
            h = x
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h)) if self.last else h


def split_stages(model: GPT, n_stages: int = 2) -> list[Stage]:
    """Cuts ``model`` into ``n_stages`` pipeline stages with contiguous, near-equal groups of
    blocks (earlier stages get the extra block). Stage 0 takes bytes and returns the hidden
    state [B, T, d]; the last stage returns logits. A tied head would be split across stages,
    so it is refused."""
    n_layer = len(model.blocks)
    if not 1 <= n_stages <= n_layer:
        raise ValueError(f"cannot cut {n_layer} blocks into {n_stages} stages")
    if model.cfg.tie_weights and n_stages > 1:
        raise ValueError("tie_weights=True shares the head with the embedding; untie it to split")
    stages, start = [], 0
    for s in range(n_stages):
        count = n_layer // n_stages + (1 if s < n_layer % n_stages else 0)
        blocks = list(model.blocks[start : start + count])
        stages.append(Stage(model, blocks, first=s == 0, last=s == n_stages - 1))
        start += count
    return stages


def loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-byte cross-entropy in nats (an untrained model gives about ln 256 = 5.545)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.no_grad()
def evaluate(model: nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean loss over fixed batches, in eval mode."""
    was_training = model.training
    model.eval()
    total = sum(loss(model(x), y).item() for x, y in batches) / len(batches)
    model.train(was_training)
    return total


def time_step(
    cfg: GPTConfig, batch: int = 16, seq: int = 128, warmup: int = 5, steps: int = 30
) -> float:
    """Median seconds of one training step (forward, backward, AdamW) on random bytes."""
    model = GPT(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, seq), generator=g)
    y = torch.randint(0, VOCAB, (batch, seq), generator=g)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss(model(x), y).backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name, cfg in (("quick", QUICK), ("full", FULL)):
        n = GPT(cfg).n_params()
        print(f"{name}: {cfg} {n / 1e6:.3f} M parameters, {time_step(cfg) * 1e3:.1f} ms/step")
