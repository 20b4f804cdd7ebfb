"""Byte-level training corpus built from the Python standard library's own sources.

Why this corpus: the examples must train a real language model on every machine without a
download. Every Python installation carries a few MiB of well-formed, varied text: the
standard library's ``.py`` files. Bytes are tokens (vocabulary 256), so no tokenizer either.

Selection (``select_files``), relative to ``sysconfig.get_paths()["stdlib"]``:

* every ``*.py`` file, sorted by its relative POSIX path (byte order, so the same everywhere);
* skipped top-level entries: ``site-packages`` / ``dist-packages`` (whatever the machine has
  installed), ``lib-dynload`` and ``config-*`` (build products), ``test`` (17 MiB of test
  code and test data would dominate), ``idlelib``, ``turtledemo``, ``tkinter``, ``lib2to3``,
  ``ensurepip``, ``venv`` (applications, GUI code and bundled scripts rather than library
  code), ``pydoc_data`` and ``encodings`` (generated help text and codec tables), and
  ``__phello__`` (import-system test fixtures);
* skipped at any depth: directories named ``test``, ``tests`` or ``__pycache__``;
* skipped files: ``_sysconfigdata*.py`` (generated at build time, holds machine paths);
* skipped because distributions add or remove them: ``sitecustomize.py`` and
  ``_distutils_system_mod.py`` (Debian adds them), ``ctypes/macholib`` (Debian drops it).

The files are concatenated (each followed by one ``\\n``) and cut at ``max_bytes``; CPython
3.11.7 gives 8,386,068 bytes from 429 files, just under the default cap of 8 MiB. The result
depends only on the installed standard library, which is the same for one Python patch release
built from python.org's sources; another patch release, or a distribution's patches, change
the contents (Debian's 3.11.2 selects the same 429 files as pyenv's 3.11.7, with a different
hash). ``Corpus.sha256`` identifies the corpus, and runs should record it.

Split: the first 90 % of the bytes are training data, the last 10 % validation. Because the
files are sorted, validation is whole held-out modules (the end of the alphabet), which
measures generalisation rather than memorisation of neighbouring lines.

Two ways to draw training data:

* streaming, for DiLoCo (``Corpus.train_batch``): random windows, a pure function of
  ``(seed, step, worker)``. The training bytes are cut into 4 KiB chunks dealt round-robin to
  the workers, so workers see disjoint data drawn from the whole corpus (i.i.d. shards);
* fixed samples, for the pipeline example (``Corpus.samples``): ``n`` fixed windows addressed
  by sample id, visited once per epoch in a seeded order (AQ-SGD caches one activation per
  sample id and needs the same samples every epoch).
"""

from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

DEFAULT_MAX_BYTES = 8 << 20
VAL_FRACTION = 0.10
# Workers get whole chunks of this many training bytes, dealt round-robin.
CHUNK_BYTES = 4096

_SKIP_TOP = {
    "site-packages",
    "dist-packages",
    "lib-dynload",
    "test",
    "idlelib",
    "turtledemo",
    "tkinter",
    "lib2to3",
    "ensurepip",
    "venv",
    "pydoc_data",
    "encodings",
    "__phello__",
}
_SKIP_ANY_DIR = {"test", "tests", "__pycache__"}
_SKIP_FILES = {"sitecustomize.py", "_distutils_system_mod.py"}
_SKIP_PREFIXES = ("ctypes/macholib/",)


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def select_files(root: Path) -> list[str]:
    """The corpus files under ``root``, as sorted relative POSIX paths (see module docstring)."""
    chosen = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        top = rel_dir == Path(".")
        # Prune skipped directories in place so the walk never enters them.
        dirnames[:] = [
            d
            for d in dirnames
            if d not in _SKIP_ANY_DIR
            and not (top and (d in _SKIP_TOP or d.startswith("config-")))
        ]
        for name in filenames:
            if not name.endswith(".py") or name.startswith("_sysconfigdata"):
                continue
            rel = (rel_dir / name).as_posix()
            if name in _SKIP_FILES or rel.startswith(_SKIP_PREFIXES):
                continue
            if (Path(dirpath) / name).is_file():
                chosen.append(rel)
    chosen.sort(key=lambda s: s.encode())
    return chosen


def load_bytes(max_bytes: int = DEFAULT_MAX_BYTES, root: Path | None = None) -> tuple[bytes, int]:
    """Concatenated corpus bytes, at most ``max_bytes``, and how many files contributed."""
    root = stdlib_root() if root is None else root
    pieces, size, used = [], 0, 0
    for rel in select_files(root):
        if size >= max_bytes:
            break
        blob = (root / rel).read_bytes() + b"\n"
        pieces.append(blob)
        size += len(blob)
        used += 1
    return b"".join(pieces)[:max_bytes], used


def _windows(data: torch.Tensor, starts: np.ndarray, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-byte targets for windows of ``seq + 1`` bytes at ``starts``."""
    idx = torch.from_numpy(starts.astype(np.int64))[:, None] + torch.arange(seq + 1)
    w = data[idx].long()
    return w[:, :-1].contiguous(), w[:, 1:].contiguous()


class Corpus:
    """The standard-library byte corpus, split 90/10 into training and validation bytes.

    Attributes: ``sha256`` (hex digest of the bytes), ``n_files``, ``train`` and ``val``
    (uint8 tensors), ``seed`` (for ``train_batch``), ``shift`` (``"swapcase"``: every ASCII
    letter's case swapped, a shifted distribution for fine-tuning).
    """

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, seed: int = 0, root: Path | None = None,
        shift: str = "none",
    ):
        raw, self.n_files = load_bytes(max_bytes, root)
        if shift == "swapcase":
            # A shifted distribution for fine-tuning (same structure, other byte statistics):
            # "def f(self):" becomes "DEF F(SELF):".
            raw = raw.swapcase()
        elif shift != "none":
            raise ValueError(f"unknown corpus shift {shift!r} (none, swapcase)")
        self.shift = shift
        if len(raw) < 64 * CHUNK_BYTES:
            raise ValueError(f"corpus too small: {len(raw)} bytes (max_bytes={max_bytes})")
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.seed = seed
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
        n_val = int(len(raw) * VAL_FRACTION)
        self.train = data[: len(raw) - n_val]
        self.val = data[len(raw) - n_val :]

    def __len__(self) -> int:
        return len(self.train) + len(self.val)

    def describe(self) -> str:
        return (
            f"stdlib corpus: {len(self)} bytes from {self.n_files} files, "
            f"train {len(self.train)} / val {len(self.val)}, sha256 {self.sha256[:16]}"
        )

    def train_batch(
        self, step: int, worker: int = 0, n_workers: int = 1, batch: int = 16, seq: int = 128
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Training inputs and targets, int64 [batch, seq], a pure function of
        ``(seed, step, worker, n_workers, batch, seq)``; windows at ``train_starts``."""
        return _windows(self.train, self.train_starts(step, worker, n_workers, batch, seq), seq)

    def train_starts(
        self, step: int, worker: int, n_workers: int, batch: int, seq: int
    ) -> np.ndarray:
        """Offsets in the training split of the ``seq + 1``-byte windows of one batch.

        Worker ``w`` of ``n_workers`` draws only from training chunks ``c`` with
        ``c % n_workers == w``; each window lies inside one chunk.
        """
        if not 0 <= worker < n_workers:
            raise ValueError(f"worker {worker} not in [0, {n_workers})")
        if seq + 1 > CHUNK_BYTES:
            raise ValueError(f"seq {seq} too long for {CHUNK_BYTES}-byte chunks")
        n_chunks = len(self.train) // CHUNK_BYTES
        mine = np.arange(worker, n_chunks, n_workers)
        if len(mine) == 0:
            raise ValueError(f"{n_workers} workers but only {n_chunks} chunks")
        rng = np.random.default_rng([self.seed, step, worker, n_workers])
        chunk = rng.choice(mine, size=batch)
        offset = rng.integers(0, CHUNK_BYTES - seq, size=batch)
        return chunk * CHUNK_BYTES + offset

    def val_batches(
        self, batch: int = 16, seq: int = 128, n: int = 8
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``n`` fixed validation batches: ``n * batch`` windows evenly spaced over the split."""
        count = n * batch
        last = len(self.val) - (seq + 1)
        if last < 0:
            raise ValueError(f"validation split ({len(self.val)} bytes) shorter than seq {seq}")
        starts = np.linspace(0, last, count).astype(np.int64)
        x, y = _windows(self.val, starts, seq)
        return [(x[i * batch : (i + 1) * batch], y[i * batch : (i + 1) * batch]) for i in range(n)]

    def samples(self, n_samples: int, seq: int = 128) -> FixedSamples:
        """``n_samples`` fixed training windows, evenly spaced over the training split
        (disjoint when they fit), addressed by sample id ``0 .. n_samples - 1``."""
        last = len(self.train) - (seq + 1)
        if n_samples < 1 or last < 0:
            raise ValueError(f"cannot take {n_samples} samples of seq {seq}")
        starts = np.linspace(0, last, n_samples).astype(np.int64)
        x, y = _windows(self.train, starts, seq)
        return FixedSamples(x, y)


@dataclass
class FixedSamples:
    """A fixed set of training sequences: ``x[i]``, ``y[i]`` (int64 [seq]) is sample id ``i``."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return self.x.shape[0]

    def epoch_order(self, epoch: int, seed: int = 0) -> torch.Tensor:
        """The sample ids in the order epoch ``epoch`` visits them (a seeded permutation)."""
        rng = np.random.default_rng([seed, epoch])
        return torch.from_numpy(rng.permutation(len(self)).astype(np.int64))

    def batches(self, epoch: int, batch: int, seed: int = 0):
        """Yields ``(ids, x, y)`` for one epoch in ``epoch_order``; the last batch may be short."""
        order = self.epoch_order(epoch, seed)
        for i in range(0, len(order), batch):
            ids = order[i : i + batch]
            yield ids, self.x[ids], self.y[ids]
