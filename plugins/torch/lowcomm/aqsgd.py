"""AQ-SGD (Wang et al., NeurIPS 2022) on a pipeline link: activations travel as b-bit deltas
against what the receiver already holds for the same sample.

    import lowcomm.aqsgd as aq
    link = aq.Link(peer=1, sample_shape=(seq, d), bits=2)           # stage 0, and on stage 1
    link.send(hidden.detach(), ids)     # stage 0: forward activation of samples `ids`
    h = link.recv(ids)                  # stage 1: the decoded activation
    link.send_grad(h.grad, ids)         # stage 1: gradient back, 8-bit
    g = link.recv_grad(ids)             # stage 0: hidden.backward(g)

Both ends keep a cache m(ξ) per sample id ξ: the sender encodes codes = Q_b(x − m), sets
m ← m + D(codes) (exactly what the receiver decodes), and sends the codes; the receiver
computes x̂ = m + D(codes) and sets m ← x̂. So the caches stay bit-identical and the error of
x̂ is one quantization of a delta that shrinks as training converges. A sample's first
appearance is sent at full precision (first="fp32") or 8-bit (first="q8"), which seeds m.
Gradients go back directly quantized (backward="q8" by default; fewer than 8 bits is
refused: 4-bit backward gradients hurt convergence badly).

The quantizer is lowcomm's codec ("q{bits}:block=..", absmax, round to nearest): on the CPU, or
on the GPU for a link on a CUDA device (`device=`), with the same bytes either way, so one end
on the GPU and the other on the CPU stay in step. A CUDA link keeps a RAM cache on its device
and encodes and decodes there; only the codes cross to the host, where the messages travel
(the tensors handed to torch.distributed are CPU tensors, so any backend that honours tags
carries them). A file-backed cache stays in host memory, its rows copied to and from the
device as they are used. mode="direct" sends Q_b(x) (the baseline AQ-SGD improves on) and
mode="fp32" the activation itself, for comparisons on the same link.

Cache cost: numel(sample_shape) × element size per sample at each end (fp32 activations of
[128, 256]: 128 KiB per sample); in RAM (grown as ids arrive) or in a memory-mapped file
(`cache_path`, fixed `capacity`) for datasets larger than RAM, served from the page cache.

Messages (torch.distributed point-to-point on `group`, tags tag..tag+3): a header of int64s
(magic, direction, count, number of new samples, the ids) then the payload. The receiver
checks the ids against its own and which samples are new against its cache, so a pair whose
caches diverged (one end restored from another checkpoint) fails with a clear error instead
of decoding garbage.
"""
import contextlib
import hashlib
import math
import time
import warnings

import torch
import torch.distributed as dist

from lowcomm import _C

_MAGIC = 0x4C4341515347  # "LCAQSG"
_FWD, _BWD = 1, 2
_BACKWARD_OK = ("fp32", "none", "bf16", "fp16", "q8", "minmax8")


class ActivationCache:
    """m(ξ) for every sample id ξ seen: rows of a [capacity, numel] tensor, in RAM or in a
    memory-mapped file. Rows are assigned in order of first appearance, so both ends of a
    link assign the same rows."""

    def __init__(self, sample_shape, dtype=torch.float32, capacity=None, path=None,
                 max_samples=None, device="cpu"):
        self.sample_shape = tuple(int(s) for s in sample_shape)
        self.numel = math.prod(self.sample_shape)
        self.dtype = dtype
        self.path = path
        # Where rows are read to and written from; the rows themselves live there too, except
        # in a memory-mapped file (host memory).
        self.device = torch.device(device)
        # The most samples it holds: a file's capacity, or a memory budget (None: unbounded).
        self.limit = capacity if path is not None else max_samples
        self.slots = {}  # sample id -> row
        self.updates = 0
        if path is not None:
            if not capacity:
                raise ValueError("lowcomm.aqsgd: a file-backed cache needs a capacity")
            self.data = torch.from_file(path, shared=True, size=capacity * self.numel,
                                        dtype=dtype).view(capacity, self.numel)
        else:
            rows = capacity or 64
            self.data = torch.zeros(rows if self.limit is None else min(rows, self.limit),
                                    self.numel, dtype=dtype, device=self.device)

    def read(self, rows):
        """The cached rows, on the cache's device."""
        return self.data[rows].to(self.device)

    def write(self, rows, values):
        self.data[rows] = values.to(self.data.device)

    @property
    def bytes_per_sample(self):
        return self.numel * self.data.element_size()

    def __len__(self):
        return len(self.slots)

    def room(self, wanted):
        """How many of `wanted` new samples get rows (the rest travel uncached)."""
        if self.limit is None:
            return wanted
        return max(0, min(wanted, self.limit - len(self.slots)))

    def rows(self, ids):
        """(rows of ids already cached, their positions in ids, positions of new ids); the new
        ids get the next rows, in order."""
        old_pos, old_rows, new_pos = [], [], []
        for i, s in enumerate(ids):
            r = self.slots.get(s)
            if r is None:
                new_pos.append(i)
            else:
                old_pos.append(i)
                old_rows.append(r)
        return old_rows, old_pos, new_pos

    def add(self, new_ids):
        need = len(self.slots) + len(new_ids)
        if need > self.data.shape[0]:
            if self.path is not None:
                raise RuntimeError(f"lowcomm.aqsgd: the cache file {self.path} holds "
                                   f"{self.data.shape[0]} samples; {need} needed (raise "
                                   "capacity)")
            if self.limit is not None and need > self.limit:
                raise RuntimeError(f"lowcomm.aqsgd: the cache's budget holds {self.limit} "
                                   f"samples; {need} needed")
            rows = max(need, 2 * self.data.shape[0])
            grown = torch.zeros(rows if self.limit is None else min(rows, self.limit),
                                self.numel, dtype=self.dtype, device=self.data.device)
            grown[:self.data.shape[0]] = self.data
            self.data = grown
        rows = []
        for s in new_ids:
            self.slots[s] = len(self.slots)
            rows.append(self.slots[s])
        return rows

    def ids(self):
        out = [0] * len(self.slots)
        for s, r in self.slots.items():
            out[r] = s
        return out

    def digest(self, data=True):
        """A hash of the ids (in row order) and, with data, of every cached row."""
        h = hashlib.blake2b(digest_size=16)
        h.update(torch.tensor(self.ids(), dtype=torch.int64).numpy().tobytes())
        if data and self.slots:
            h.update(self.data[:len(self.slots)].cpu().contiguous().view(torch.uint8).numpy()
                     .tobytes())
        return h.hexdigest()

    def state_dict(self, with_data=True):
        n = len(self.slots)
        st = {"ids": self.ids(), "updates": self.updates, "sample_shape": self.sample_shape,
              "dtype": str(self.dtype)}
        if with_data or self.path is None:
            st["data"] = self.data[:n].clone()
        else:
            st["path"] = self.path  # the rows live in the file
        return st

    def load_state_dict(self, st):
        if tuple(st["sample_shape"]) != self.sample_shape or st["dtype"] != str(self.dtype):
            raise ValueError(f"lowcomm.aqsgd: cache state of {st['sample_shape']} "
                             f"{st['dtype']}, this cache holds {self.sample_shape} {self.dtype}")
        if self.limit is not None and len(st["ids"]) > self.limit:
            raise ValueError(f"lowcomm.aqsgd: the cache state holds {len(st['ids'])} samples, "
                             f"this cache {self.limit} at most")
        self.slots = {}
        self.add(list(st["ids"]))
        if "data" in st:
            self.data[:len(self.slots)] = st["data"]
        elif st["path"] != self.path:
            raise ValueError(f"lowcomm.aqsgd: the cache state refers to {st['path']}, this "
                             f"cache is {self.path}")
        self.updates = int(st["updates"])


class Link:
    """One end of an AQ-SGD pipeline link to `peer` (a global rank); see the module doc.

    mode: "aqsgd" (deltas against the per-sample cache), "direct" (Q_b of the activation),
      "fp32" (the activation as it is).
    bits: 2, 3, 4 (or 8) for the forward codes; block: elements per scale.
    rotate: quantize the deltas (direct mode: the activations) after a randomized Hadamard
      rotation, H·diag(±1) over runs of `block` elements (both ends draw the same signs), and
      rotate back after decoding: outliers spread over their run before the scale is taken.
      Block scales only; the activations must be finite (else a clear error).
    scales: "block" (one scale per `block` consecutive elements) or "channel" (one scale per
      feature channel, the last dimension of sample_shape, over all the message's tokens:
      AQ-SGD's quantizer; codec "q<bits>:col=<channels>").
    first: how a sample's first appearance travels: "fp32" or "q8".
    backward: the gradients' codec, 8 bits or more ("q8", "bf16", "fp32", ...); "q4" (AQ-SGD's
      fw2/bw4), "q3" or "q2" only with allow_low_bit_backward=True (they hurt training from
      scratch badly here; the paper's fine-tuning used them).
    cache_dtype: the cache's (and decoded activation's) dtype; activations are converted.
    capacity / cache_path: the cache's initial rows / a file for a memory-mapped cache (then
      capacity is fixed). cache_budget_bytes: the most a RAM cache may hold. A full cache
      (file or budget) keeps the samples it has; new samples beyond it travel at full
      precision (or `first`) at every appearance, uncached, with a warning; both ends decide
      alike and the header says which, so ends given different sizes fail clearly.
    device: where the cache lives and the codecs run ("cuda:0": the CUDA kernels, the same
      bytes as the CPU's); received activations and gradients are returned there, and sent ones
      are moved there first. Default: the CPU.
    Sends return at once (the tensors are copied or encoded first); flush() waits for them.
    """

    max_in_flight = 64  # micro-batches sent and not yet waited for

    def __init__(self, peer, sample_shape, *, group=None, mode="aqsgd", bits=2, block=128,
                 scales="block", first="fp32", backward="q8", cache_dtype=torch.float32,
                 capacity=None, cache_path=None, tag=100, allow_low_bit_backward=False,
                 rotate=False, cache_budget_bytes=None, device=None):
        if mode not in ("aqsgd", "direct", "fp32"):
            raise ValueError(f"lowcomm.aqsgd: mode must be aqsgd, direct or fp32, got {mode!r}")
        if bits not in (1, 2, 3, 4, 8):
            raise ValueError(f"lowcomm.aqsgd: bits must be 1, 2, 3, 4 or 8, got {bits}")
        if first not in ("fp32", "q8"):
            raise ValueError(f"lowcomm.aqsgd: first must be 'fp32' or 'q8', got {first!r}")
        if backward.split(":")[0] not in _BACKWARD_OK and not (
                allow_low_bit_backward and backward.split(":")[0] in ("q4", "q3", "q2")):
            raise ValueError(f"lowcomm.aqsgd: backward gradients need 8 bits or more "
                             f"({', '.join(_BACKWARD_OK)}), got {backward!r}: fewer bits on "
                             "the backward pass hurt convergence badly (allow_low_bit_backward"
                             "=True takes q4, q3 or q2)")
        self.peer = int(peer)
        self.group = group
        self.device = torch.device("cpu" if device is None else device)
        self.mode = mode
        if scales not in ("block", "channel"):
            raise ValueError(f"lowcomm.aqsgd: scales must be 'block' or 'channel', got "
                             f"{scales!r}")
        if scales == "channel" and bits == 1:
            raise ValueError("lowcomm.aqsgd: 1-bit codes take block scales, not channel scales")
        self.scales = scales
        self.rotation = None
        if rotate and mode != "fp32":  # fp32 sends the activations as they are
            n = math.prod(int(d) for d in sample_shape)
            if scales != "block" or block & (block - 1) or n % block:
                raise ValueError(f"lowcomm.aqsgd: rotate takes block scales whose power-of-two "
                                 f"block divides the sample's {n} elements, got scales="
                                 f"{scales!r}, block={block}")
            signs = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(
                0x4C43524F54 + int(tag))).to(torch.float32).mul_(2).sub_(1)
            self.rotation = (int(block), signs.to(self.device))
        self.codec = (f"q{bits}:col={int(sample_shape[-1])}" if scales == "channel"
                      else f"q{bits}:block={block}")
        self.first_codec = None if first == "fp32" else f"q8:block={block}"
        self.backward = None if backward in ("fp32", "none") else backward
        self.sample_shape = tuple(int(s) for s in sample_shape)
        per_sample = math.prod(self.sample_shape) * torch.tensor([], dtype=cache_dtype) \
            .element_size()
        if cache_budget_bytes is not None and cache_budget_bytes < 0:
            raise ValueError(f"lowcomm.aqsgd: cache_budget_bytes must be >= 0, got "
                             f"{cache_budget_bytes}")
        self.cache = ActivationCache(
            self.sample_shape, cache_dtype, capacity, cache_path,
            max_samples=None if cache_budget_bytes is None else cache_budget_bytes // per_sample,
            device=self.device)
        self.uncached_sends = 0  # samples sent at full precision because the cache was full
        self.tag = int(tag)
        self.in_flight = []  # sends not yet known complete: (requests, buffers they read)
        self.bytes_sent = 0
        self.bytes_received = 0
        # Where this end's time goes (seconds): in the link's calls (send, recv, send_grad,
        # recv_grad, flush) in all, and the part of it blocked on the network (receives and
        # waits for sends); the rest is lowcomm's CPU work: codecs, cache, copies, Python.
        self.link_s = 0.0
        self.wait_s = 0.0
        # Stochastic rounding of the gradients (backward="q4:sr", ...): every message draws
        # from its own stretch of the codec's counter-based random stream.
        self.grad_offset = 0

    # -- forward ------------------------------------------------------------------------------

    def send(self, x, sample_ids):
        """Send the activations x [len(sample_ids), *sample_shape] of these samples."""
        with self._timed():
            self._send(x, sample_ids)

    def recv(self, sample_ids):
        """The activations of these samples, as the sender sent them: [len, *sample_shape]."""
        with self._timed():
            return self._recv(sample_ids)

    def send_grad(self, grad, sample_ids):
        """Send the gradient w.r.t. the received activation of these samples back."""
        with self._timed():
            self._send_grad(grad, sample_ids)

    def recv_grad(self, sample_ids):
        """The gradients of these samples' activations, as the receiver sent them."""
        with self._timed():
            return self._recv_grad(sample_ids)

    def flush(self):
        """Wait until every send of this end has completed (sends return at once; at most
        max_in_flight micro-batches are outstanding)."""
        with self._timed():
            while self.in_flight:
                self._complete_oldest()

    @contextlib.contextmanager
    def _timed(self):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.link_s += time.perf_counter() - t0

    @torch.no_grad()
    def _send(self, x, sample_ids):
        ids = _ids(sample_ids)
        x = self._rows(x, len(ids))
        old_rows, old_pos, new_pos = self.cache.rows(ids) if self.mode == "aqsgd" else (
            [], [], list(range(len(ids))))
        field = self._new_field(len(new_pos))  # before the new samples take rows
        parts = []
        if self.rotation is not None and not bool(torch.isfinite(x).all()):
            raise ValueError("lowcomm.aqsgd: a rotating link needs finite activations")
        if self.mode == "aqsgd":
            if old_pos:
                m = self.cache.read(old_rows)
                if self.rotation is None:
                    parts.append(_C.encode_delta(self.codec, x[old_pos].contiguous(), m))
                else:  # Q(R(x − m)); m += R⁻¹(D(codes)), as the receiver computes it
                    codes = _C.encode(self.codec, self._rotate(x[old_pos] - m))
                    parts.append(codes)
                    m += self._unrotate(self._decoded(codes, m.shape)).to(m.dtype)
                self.cache.write(old_rows, m)
            if new_pos:
                fresh = x[new_pos].contiguous()
                if self.first_codec is None:
                    parts.append(fresh.view(torch.uint8).reshape(-1))
                else:
                    codes = _C.encode(self.first_codec, fresh)
                    parts.append(codes)
                    _C.decode(self.first_codec, codes, fresh)
                kept = self._kept(len(new_pos))
                rows = self.cache.add([ids[i] for i in new_pos[:kept]])  # may grow the cache
                self.cache.write(rows, fresh[:kept])
            self.cache.updates += 1
        elif self.mode == "direct":
            parts.append(_C.encode(self.codec, x if self.rotation is None else self._rotate(x)))
        else:
            parts.append(x.view(torch.uint8).reshape(-1).clone())
        self._post(_FWD, ids, field, parts)

    @torch.no_grad()
    def _recv(self, sample_ids):
        ids = _ids(sample_ids)
        old_rows, old_pos, new_pos = self.cache.rows(ids) if self.mode == "aqsgd" else (
            [], [], list(range(len(ids))))
        self._header(_FWD, ids, self._new_field(len(new_pos)))
        n = self.cache.numel
        out = torch.empty(len(ids), n, dtype=self.cache.dtype, device=self.device)
        if self.mode == "aqsgd":
            sizes = [_C.encoded_size(self.codec, len(old_pos) * n) if old_pos else 0,
                     self._first_size(len(new_pos) * n) if new_pos else 0]
            payload = self._payload(sum(sizes))
            if old_pos:
                m = self.cache.read(old_rows)
                if self.rotation is None:
                    dec = torch.empty_like(m)
                    _C.decode_delta(self.codec, payload[:sizes[0]], m, dec)
                else:
                    m += self._unrotate(self._decoded(payload[:sizes[0]], m.shape)).to(m.dtype)
                    dec = m
                self.cache.write(old_rows, m)
                out[old_pos] = dec
            if new_pos:
                fresh = torch.empty(len(new_pos), n, dtype=self.cache.dtype, device=self.device)
                codes = payload[sizes[0]:]
                if self.first_codec is None:
                    fresh.view(torch.uint8).reshape(-1).copy_(codes)
                else:
                    _C.decode(self.first_codec, codes, fresh)
                kept = self._kept(len(new_pos))
                rows = self.cache.add([ids[i] for i in new_pos[:kept]])  # may grow the cache
                self.cache.write(rows, fresh[:kept])
                out[new_pos] = fresh
            self.cache.updates += 1
        elif self.mode == "direct":
            codes = self._payload(_C.encoded_size(self.codec, out.numel()))
            if self.rotation is None:
                _C.decode(self.codec, codes, out)
            else:
                out = self._unrotate(self._decoded(codes, out.shape)).to(self.cache.dtype)
        else:
            out.view(torch.uint8).reshape(-1).copy_(self._payload(out.numel() *
                                                                  out.element_size()))
        return out.view(len(ids), *self.sample_shape)

    # -- backward -----------------------------------------------------------------------------

    @torch.no_grad()
    def _send_grad(self, grad, sample_ids):
        ids = _ids(sample_ids)
        g = self._rows(grad, len(ids))
        if self.backward is None:
            part = g.view(torch.uint8).reshape(-1).clone()
        else:
            # This end's own stream: replicas of a data-parallel stage round independently.
            seed = (self.tag << 32) ^ (dist.get_rank() if dist.is_initialized() else 0)
            part = _C.encode(self.backward, g, seed=seed, offset=self.grad_offset)
            self.grad_offset += g.numel()
        self._post(_BWD, ids, 0, [part])

    @torch.no_grad()
    def _recv_grad(self, sample_ids):
        ids = _ids(sample_ids)
        self._header(_BWD, ids, 0)
        out = torch.empty(len(ids), self.cache.numel, dtype=self.cache.dtype, device=self.device)
        if self.backward is None:
            out.view(torch.uint8).reshape(-1).copy_(self._payload(out.numel() *
                                                                  out.element_size()))
        else:
            _C.decode(self.backward, self._payload(_C.encoded_size(self.backward, out.numel())),
                      out)
        return out.view(len(ids), *self.sample_shape)

    # -- checkpoints and checks ---------------------------------------------------------------

    def state_dict(self, with_data=True):
        return {"mode": self.mode, "codec": self.codec, "cache": self.cache.state_dict(with_data),
                "grad_offset": self.grad_offset}

    def load_state_dict(self, st, verify=True):
        """Restore the cache; with verify (both ends at once) the two ends compare digests."""
        if (st["mode"], st["codec"]) != (self.mode, self.codec):
            raise ValueError(f"lowcomm.aqsgd: state of a {st['mode']} {st['codec']} link, "
                             f"this is {self.mode} {self.codec}")
        self.cache.load_state_dict(st["cache"])
        self.grad_offset = int(st.get("grad_offset", 0))
        if verify:
            self.verify()

    def verify(self, data=True):
        """Both ends at once: raise unless the two caches hold the same samples (and, with
        data, the same bytes) and have the same size limit."""
        limit = -1 if self.cache.limit is None else int(self.cache.limit)
        mine = (bytes.fromhex(self.cache.digest(data)) + self.cache.updates.to_bytes(8, "little")
                + limit.to_bytes(8, "little", signed=True))
        out = torch.tensor(list(mine), dtype=torch.uint8)
        theirs = torch.empty_like(out)
        reqs = [dist.isend(out, self.peer, group=self.group, tag=self.tag + 4),
                dist.irecv(theirs, self.peer, group=self.group, tag=self.tag + 4)]
        for r in reqs:
            r.wait()
        if not torch.equal(out, theirs):
            raise RuntimeError(
                f"lowcomm.aqsgd: the caches of this rank and rank {self.peer} differ "
                f"({len(self.cache)} samples, {self.cache.updates} updates here; digests "
                f"{bytes(out.tolist()).hex()} vs {bytes(theirs.tolist()).hex()}; the last 8 "
                f"bytes: the most samples each holds, -1 unbounded): restore both ends from the "
                "same checkpoint and give both the same cache size")

    # -- a full cache -------------------------------------------------------------------------

    def _new_field(self, n_new):
        """The header's count of new samples: those that get rows, plus (<< 32) those that
        travel uncached because the cache is full. Both ends compute it; they must agree."""
        if self.mode != "aqsgd":
            return 0
        kept = self.cache.room(n_new)
        return kept + ((n_new - kept) << 32)

    def _kept(self, n_new):
        kept = self.cache.room(n_new)
        if kept < n_new:
            if not self.uncached_sends:
                warnings.warn(f"lowcomm.aqsgd: the activation cache is full ({self.cache.limit} "
                              f"samples); samples beyond it travel at full precision, uncached",
                              stacklevel=4)
            self.uncached_sends += n_new - kept
        return kept

    # -- the randomized Hadamard rotation ---------------------------------------------------

    def _decoded(self, codes, shape):
        out = torch.empty(shape, dtype=torch.float32, device=self.device)  # fp32, cast once
        _C.decode(self.codec, codes, out)
        return out

    def _rotate(self, v):
        """H·diag(signs)·v per run of `block` elements (orthonormal), in fp32."""
        return _hadamard(v.float() * self.rotation[1], self.rotation[0])

    def _unrotate(self, w):
        """The inverse: diag(signs)·H·w (H is its own inverse)."""
        return _hadamard(w, self.rotation[0]).mul_(self.rotation[1])

    # -- wire ---------------------------------------------------------------------------------

    def _rows(self, x, count):
        if tuple(x.shape) != (count, *self.sample_shape):
            raise ValueError(f"lowcomm.aqsgd: expected a tensor of shape "
                             f"{(count, *self.sample_shape)}, got {tuple(x.shape)}")
        return x.to(self.device, self.cache.dtype).reshape(count, self.cache.numel).contiguous()

    def _first_size(self, n):
        if self.first_codec is None:
            return n * torch.tensor([], dtype=self.cache.dtype).element_size()
        return _C.encoded_size(self.first_codec, n)

    def _post(self, direction, ids, n_new, parts):
        head = torch.tensor([_MAGIC, direction, len(ids), n_new] + ids, dtype=torch.int64)
        payload = parts[0] if len(parts) == 1 else torch.cat(parts)
        payload = payload.cpu()  # the codes (or values) cross to the host; the wire is there
        reqs = [dist.isend(head, self.peer, group=self.group, tag=self.tag + 2 * (direction - 1)),
                dist.isend(payload, self.peer, group=self.group,
                           tag=self.tag + 2 * (direction - 1) + 1)]
        self.in_flight.append((reqs, (head, payload)))
        while len(self.in_flight) > self.max_in_flight:
            self._complete_oldest()
        self.bytes_sent += head.numel() * 8 + payload.numel()

    def _complete_oldest(self):
        reqs, _ = self.in_flight.pop(0)
        t0 = time.perf_counter()
        for r in reqs:
            r.wait()
        self.wait_s += time.perf_counter() - t0

    def _header(self, direction, ids, n_new):
        head = torch.empty(4 + len(ids), dtype=torch.int64)
        t0 = time.perf_counter()
        dist.recv(head, self.peer, group=self.group, tag=self.tag + 2 * (direction - 1))
        self.wait_s += time.perf_counter() - t0
        self._payload_tag = self.tag + 2 * (direction - 1) + 1
        got = head.tolist()
        what = "activations" if direction == _FWD else "gradients"
        if got[0] != _MAGIC or got[1] != direction or got[2] != len(ids):
            raise RuntimeError(f"lowcomm.aqsgd: rank {self.peer} sent no {what} header for "
                               f"{len(ids)} samples (got {got[:4]})")
        if got[4:] != ids:
            raise RuntimeError(f"lowcomm.aqsgd: rank {self.peer} sent {what} of samples "
                               f"{got[4:]}, this rank expected {ids}")
        if got[3] != n_new:
            def say(v):
                return f"{v & 0xFFFFFFFF} new to cache and {v >> 32} uncached"
            raise RuntimeError(f"lowcomm.aqsgd: the caches differ: rank {self.peer} sent "
                               f"samples {ids} as {say(got[3])}, this rank's cache has "
                               f"{say(n_new)}; restore both ends from the same checkpoint and "
                               "give both the same cache size")
        self.bytes_received += head.numel() * 8

    def _payload(self, nbytes):
        buf = torch.empty(nbytes, dtype=torch.uint8)
        t0 = time.perf_counter()
        dist.recv(buf, self.peer, group=self.group, tag=self._payload_tag)
        self.wait_s += time.perf_counter() - t0
        self.bytes_received += nbytes
        return buf.to(self.device)


def _hadamard(v, run):
    """The normalized fast Walsh–Hadamard transform of every run of `run` (a power of two)
    consecutive elements of v (rows [k, n], n a multiple of run). The same float operations
    in the same order on both ends of a link, so they agree bitwise."""
    shape = v.shape
    y = v.reshape(-1, run)
    h = 1
    while h < run:
        y = y.view(y.shape[0], run // (2 * h), 2, h)
        a, b = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2)
        h *= 2
    return y.reshape(shape).mul_(run ** -0.5)


def _ids(sample_ids):
    ids = [int(s) for s in (sample_ids.tolist() if torch.is_tensor(sample_ids) else sample_ids)]
    if len(set(ids)) != len(ids):
        raise ValueError(f"lowcomm.aqsgd: a sample appears twice in one micro-batch: {ids}")
    return ids

