"""An AQ-SGD link inside a torch.distributed.pipelining trainer (PipelineStage, ScheduleGPipe,
Schedule1F1B), with public APIs only.

PipelineStage's own send/recv cannot carry AQ-SGD: its messages name no samples (so no
per-sample cache can be addressed), and the gradient it sends back always has the shape of the
tensor sent forward. So the activation travels over a lowcomm.aqsgd.Link from inside the
stage modules, and PipelineStage carries a 1-element token per micro-batch:

    link = lowcomm.aqsgd.Link(peer, sample_shape, group=link_group, bits=2)
    stage_module = aqsgd_stages.SendingStage(stage0, link)    # on stage k: forward(x, ids)
    stage_module = aqsgd_stages.ReceivingStage(stage1, link)  # on stage k+1: (token, ids)
    schedule.step(x, ids=ids)        # ids: int64 [batch], split into micro-batches like x

SendActivations sends its input's b-bit deltas (sends do not block) and returns the token;
its backward receives the 8-bit gradient. RecvActivations returns the decoded activation and
sends the gradient back in its backward. Give PipelineStage the token's shape up front
(input_args / output_args, `token_like()`), or wrap the metadata-inference pass in
`fence(stage)`: that pass must not touch the link (it would desynchronise the caches).
The link needs a group of its own whose backend honours tags (lowcomm or Gloo; NCCL ignores
tags). On CUDA stages, give the Link the stages' device (`device=`): the caches and codecs then
run there, and gradients come back on the activation's device.
"""
import contextlib

import torch
from torch import nn


def token_like(device=None):
    """The tensor PipelineStage moves between the two stages: one float needing a gradient (on
    `device`, the stages' device; default the CPU)."""
    return torch.zeros(1, requires_grad=True, device=device)


class _Quiet:
    probe = False  # True while PipelineStage infers shapes: the link stays untouched


class _Send(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, ids, link, quiet):
        ctx.live, ctx.link, ctx.ids, ctx.shape = not quiet.probe, link, ids.tolist(), x.shape
        ctx.device = x.device
        if ctx.live:
            link.send(x.detach(), ctx.ids)
        return x.new_zeros(1)

    @staticmethod
    def backward(ctx, _token_grad):
        if not ctx.live:
            return torch.zeros(ctx.shape, device=ctx.device), None, None, None
        grad = ctx.link.recv_grad(ctx.ids).reshape(ctx.shape).to(ctx.device)
        return grad, None, None, None


class _Recv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, token, ids, link, quiet):
        ctx.live, ctx.link, ctx.ids = not quiet.probe, link, ids.tolist()
        ctx.token_device = token.device
        if not ctx.live:
            return torch.zeros(len(ctx.ids), *link.sample_shape, device=link.device)
        return link.recv(ctx.ids)

    @staticmethod
    def backward(ctx, grad):
        if ctx.live:
            ctx.link.send_grad(grad.contiguous(), ctx.ids)
        return torch.zeros(1, device=ctx.token_device), None, None, None


class SendActivations(nn.Module):
    """The last module of stage k: forward(x, ids) sends x over the link, returns the token."""

    def __init__(self, link):
        super().__init__()
        self.link = link
        self.quiet = _Quiet()

    def forward(self, x, ids):
        return _Send.apply(x, ids, self.link, self.quiet)


class RecvActivations(nn.Module):
    """The first module of stage k+1: forward(token, ids) returns the activation."""

    def __init__(self, link):
        super().__init__()
        self.link = link
        self.quiet = _Quiet()

    def forward(self, token, ids):
        return _Recv.apply(token, ids, self.link, self.quiet)


class SendingStage(nn.Module):
    """Stage k as a whole: `module` (one input, the activation out) followed by the link;
    forward(x, ids) returns the token. What a trainer hands PipelineStage instead of module."""

    def __init__(self, module, link):
        super().__init__()
        self.module = module
        self.send = SendActivations(link)

    def forward(self, x, ids):
        return self.send(self.module(x), ids)


class ReceivingStage(nn.Module):
    """Stage k+1 as a whole: the link followed by `module`; forward(token, ids)."""

    def __init__(self, module, link):
        super().__init__()
        self.recv = RecvActivations(link)
        self.module = module

    def forward(self, token, ids):
        return self.module(self.recv(token, ids))


def fence(stage, *link_modules):
    """torch >= 2.15: keep PipelineStage's metadata-inference pass away from the link (for
    stages built without input_args / output_args)."""

    @contextlib.contextmanager
    def ctx(info):
        for m in link_modules:
            m.quiet.probe = info.is_metadata_inference
        try:
            yield
        finally:
            for m in link_modules:
                m.quiet.probe = False

    stage.register_forward_context(ctx)
