"""Tests of the examples' shared pieces: corpus, GPT, meter, plots.

Run from the repository root: ``.venv/bin/python -m pytest examples/tests``. CPU only, one
thread; the training test takes about 10 s on one core.
"""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lowcomm_examples import data, gpt, meter, plot  # noqa: E402

torch.set_num_threads(1)

SMALL = 1 << 20  # 1 MiB keeps most corpus tests fast


@pytest.fixture(scope="module")
def corpus():
    return data.Corpus(data.DEFAULT_MAX_BYTES, seed=7)


# --- corpus ----------------------------------------------------------------------------------


def test_selection_skips_tests_and_installed_packages():
    files = data.select_files(data.stdlib_root())
    assert files == sorted(files, key=str.encode)
    assert "os.py" in files and "json/decoder.py" in files
    for rel in files:
        parts = rel.split("/")
        assert not {"test", "tests", "__pycache__"} & set(parts[:-1]), rel
        assert parts[0] not in {"site-packages", "dist-packages", "idlelib", "encodings"}, rel
        assert not parts[-1].startswith("_sysconfigdata"), rel
        # Files some distributions add or drop would make the corpus differ between installs.
        assert parts[-1] not in {"sitecustomize.py", "_distutils_system_mod.py"}, rel
        assert not rel.startswith("ctypes/macholib/"), rel


def test_corpus_deterministic(corpus):
    again = data.Corpus(data.DEFAULT_MAX_BYTES, seed=7)
    assert again.sha256 == corpus.sha256
    assert torch.equal(again.train, corpus.train) and torch.equal(again.val, corpus.val)
    # The cap truncates the same byte stream: a smaller corpus is a prefix of the larger one.
    small = data.Corpus(SMALL)
    assert len(small) == SMALL
    assert small.sha256 != corpus.sha256
    full = torch.cat([corpus.train, corpus.val])
    assert torch.equal(torch.cat([small.train, small.val]), full[:SMALL])


def test_split_is_disjoint_and_last_tenth(corpus):
    n = len(corpus)
    assert len(corpus.val) == int(n * data.VAL_FRACTION)
    assert len(corpus.train) + len(corpus.val) == n
    # Views of one buffer, train strictly before val: no byte belongs to both.
    assert corpus.train.data_ptr() + len(corpus.train) == corpus.val.data_ptr()
    # Every validation window comes from the validation split.
    for x, y in corpus.val_batches(batch=4, seq=32, n=3):
        for row_x, row_y in zip(x, y):
            window = torch.cat([row_x[:1], row_y]).to(torch.uint8)
            assert _contains(corpus.val, window)


def _contains(haystack: torch.Tensor, needle: torch.Tensor) -> bool:
    return needle.numpy().tobytes() in haystack.numpy().tobytes()


def test_train_batches_deterministic_in_range_and_shifted(corpus):
    x, y = corpus.train_batch(step=3, worker=1, n_workers=4, batch=8, seq=64)
    assert x.shape == y.shape == (8, 64) and x.dtype == y.dtype == torch.int64
    assert int(x.min()) >= 0 and int(x.max()) < 256
    assert torch.equal(x[:, 1:], y[:, :-1])
    x2, y2 = corpus.train_batch(step=3, worker=1, n_workers=4, batch=8, seq=64)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, corpus.train_batch(step=4, worker=1, n_workers=4, batch=8, seq=64)[0])
    other_seed = data.Corpus(data.DEFAULT_MAX_BYTES, seed=8)
    x3, _ = other_seed.train_batch(step=3, worker=1, n_workers=4, batch=8, seq=64)
    assert not torch.equal(x, x3)
    for row in x:
        assert _contains(corpus.train, row.to(torch.uint8))


def test_workers_draw_from_disjoint_chunks(corpus):
    seq = 64
    for worker in range(4):
        starts = corpus.train_starts(step=2, worker=worker, n_workers=4, batch=256, seq=seq)
        chunks = starts // data.CHUNK_BYTES
        assert set((chunks % 4).tolist()) == {worker}
        assert ((starts % data.CHUNK_BYTES) + seq + 1 <= data.CHUNK_BYTES).all()
        n_chunks = len(corpus.train) // data.CHUNK_BYTES
        assert chunks.min() < 0.1 * n_chunks and chunks.max() > 0.9 * n_chunks  # whole split
        x, y = corpus.train_batch(step=2, worker=worker, n_workers=4, batch=256, seq=seq)
        assert torch.equal(x[5], corpus.train[starts[5] : starts[5] + seq].long())
        assert torch.equal(y[5], corpus.train[starts[5] + 1 : starts[5] + seq + 1].long())
    with pytest.raises(ValueError):
        corpus.train_batch(0, worker=4, n_workers=4)


def test_val_batches_fixed(corpus):
    a = corpus.val_batches(batch=4, seq=16, n=5)
    b = data.Corpus(data.DEFAULT_MAX_BYTES, seed=99).val_batches(batch=4, seq=16, n=5)
    assert len(a) == 5
    for (xa, ya), (xb, yb) in zip(a, b):
        assert xa.shape == (4, 16)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


def test_fixed_samples_stable_and_epochs_permute(corpus):
    s = corpus.samples(100, seq=64)
    t = data.Corpus(data.DEFAULT_MAX_BYTES, seed=1).samples(100, seq=64)
    assert len(s) == 100 and s.x.shape == (100, 64) and s.x.dtype == torch.int64
    assert torch.equal(s.x, t.x) and torch.equal(s.y, t.y)
    assert torch.equal(s.x[:, 1:], s.y[:, :-1])
    assert len({row.numpy().tobytes() for row in s.x}) == 100
    o0, o1 = s.epoch_order(0, seed=3), s.epoch_order(1, seed=3)
    assert sorted(o0.tolist()) == list(range(100))
    assert not torch.equal(o0, o1)
    assert torch.equal(o0, s.epoch_order(0, seed=3))
    got = []
    for ids, x, y in s.batches(epoch=0, batch=32, seed=3):
        assert torch.equal(x, s.x[ids]) and torch.equal(y, s.y[ids])
        got += ids.tolist()
    assert got == o0.tolist()


# --- GPT -------------------------------------------------------------------------------------


def test_forward_shapes_and_seeded_init():
    cfg = gpt.QUICK
    model = gpt.GPT(cfg, seed=1)
    x = torch.randint(0, 256, (3, cfg.seq))
    assert model(x).shape == (3, cfg.seq, 256)
    assert model(x[:, :10]).shape == (3, 10, 256)
    same, other = gpt.GPT(cfg, seed=1), gpt.GPT(cfg, seed=2)
    for (name, p), q, r in zip(model.named_parameters(), same.parameters(), other.parameters()):
        assert torch.equal(p, q), name
        if p.dim() > 1:
            assert not torch.equal(p, r), name
    print(f"quick: {model.n_params()} parameters, full: {gpt.GPT(gpt.FULL).n_params()}")


def test_causal():
    model = gpt.GPT(gpt.QUICK, seed=0)
    x = torch.randint(0, 256, (2, 32))
    x2 = x.clone()
    x2[:, 20:] = (x2[:, 20:] + 1) % 256
    a, b = model(x), model(x2)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.parametrize("n_stages", [2, 3])
def test_split_stages_bitwise(n_stages):
    cfg = gpt.GPTConfig(n_layer=3, n_head=2, d_model=48, seq=64)
    model = gpt.GPT(cfg, seed=5)
    stages = gpt.split_stages(model, n_stages)
    assert len(stages) == n_stages
    x = torch.randint(0, 256, (4, 64))
    h = stages[0](x)
    assert h.shape == (4, 64, cfg.d_model)
    for stage in stages[1:]:
        h = stage(h)
    assert torch.equal(h, model(x))
    # Stages partition the model's parameters (shared, not copied).
    ids = [id(p) for s in stages for p in s.parameters()]
    assert len(ids) == len(set(ids))
    assert set(ids) == {id(p) for p in model.parameters()}


def test_split_refuses_tied_head():
    tied = gpt.GPT(gpt.GPTConfig(tie_weights=True))
    assert tied.head.weight is tied.wte.weight
    with pytest.raises(ValueError, match="tie"):
        gpt.split_stages(tied, 2)


def test_training_reduces_validation_loss(corpus):
    torch.manual_seed(0)
    model = gpt.GPT(gpt.QUICK, seed=0)
    val = corpus.val_batches(batch=16, seq=128, n=4)
    before = gpt.evaluate(model, val)
    assert abs(before - math.log(256)) < 0.05
    # The bar: the cross-entropy of the training split's byte frequencies on validation, which
    # a model can only beat by using context.
    freq = torch.bincount(corpus.train.long(), minlength=256).double() + 1
    unigram = -(freq / freq.sum()).log()[corpus.val.long()].mean().item()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    for step in range(200):
        x, y = corpus.train_batch(step, batch=16, seq=128)
        opt.zero_grad(set_to_none=True)
        gpt.loss(model(x), y).backward()
        opt.step()
    after = gpt.evaluate(model, val)
    print(f"val loss {before:.3f} -> {after:.3f} (unigram {unigram:.3f})")
    assert after < unigram - 0.3
    assert after < math.log(256) - 2.0


# --- meter and plots -------------------------------------------------------------------------


def test_meter_counts_outer_compute_only():
    now = [0.0]
    m = meter.Meter(clock=lambda: now[0])
    with m.compute():
        now[0] += 2.0
        with m.compute():  # nested: not counted twice
            now[0] += 1.0
    now[0] += 1.0  # waiting
    m.add_bytes(100)
    m.add_bytes(28)
    assert m.compute_s == 3.0 and m.wall_s() == 4.0
    assert m.utilisation() == 0.75
    assert m.summary()["bytes"] == 128
    with pytest.raises(ValueError):
        m.add_bytes(-1)
    with pytest.raises(RuntimeError):
        with m.compute():
            now[0] += 1.0
            raise RuntimeError("compute failed")
    assert m.compute_s == 4.0  # time up to the failure still counts
    m.reset()
    assert m.compute_s == 0.0 and m.bytes == 0 and m.utilisation() == 0.0


def test_plots_and_csv(tmp_path):
    runs = {"a": [(0, 0.0, 5.5), (10, 1.5, 3.0)], "b": [(0, 0.0, 5.5), (10, 0.9, 3.2)]}
    pngs = plot.write_curves(tmp_path / "out" / "demo", runs, title="demo")
    assert [p.name for p in pngs] == ["demo-loss-vs-step.png", "demo-loss-vs-wall.png"]
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    path = plot.write_csv(tmp_path / "runs.csv", runs)
    lines = path.read_text().splitlines()
    assert lines[0] == "label,step,wall_s,val_loss"
    assert lines[1:] == [
        "a,0,0.000,5.5000",
        "a,10,1.500,3.0000",
        "b,0,0.000,5.5000",
        "b,10,0.900,3.2000",
    ]
