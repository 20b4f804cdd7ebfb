"""The training examples' --quick modes, run as a user runs them (separate processes, the
lowcomm backend, DiLoCo with q4 and error feedback; the pipeline with AQ-SGD 2-bit and direct
2-bit): each finishes, beats an untrained model's validation loss by a wide margin, sends its
payload at the bits it was asked for (lowcomm's byte counts against the uncompressed size), and
writes its loss PNGs, CSV and results.json. The OpenDiLoCo-style script runs with only the
backend line changed, compressed with call-order error feedback and one-hop all-reduces from
the group's options (the environment): q4 on the wire and its loss falls."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(EXAMPLES))

from lowcomm_examples import gpt  # noqa: E402

# q4 on the wire: 4-bit codes and a 32-bit scale per 128 elements (4.25 bits per element), with
# room for the owner chunks' alignment and the wire's headers: at most 4.5 of fp32's 32 bits.
Q4_BITS = 4.5


def run(args, tmp_path, env=None, timeout=600):
    e = dict(os.environ, **(env or {}))
    out = subprocess.run([sys.executable, *map(str, args)], cwd=tmp_path, env=e,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-6000:]
    return out.stdout


def check_outputs(out_dir, prefix, runs):
    results = json.loads((out_dir / "results.json").read_text())["results"]
    assert [r["run"] for r in results] == runs
    for r in results:
        untrained = r["curve"][0][2]
        assert untrained > 5.0  # ln 256 = 5.55 for bytes
        assert r["final_val_loss"] < untrained - 1.0, r
        assert r["wall_s"] > 0
    for suffix in ("-loss-vs-step.png", "-loss-vs-wall.png"):
        assert (out_dir / f"{prefix}{suffix}").stat().st_size > 1000
    assert (out_dir / f"{prefix}.csv").exists()
    return results


def check_q4_outer_steps(r):
    """The DiLoCo run's outer all-reduces went out in q4: the last one's codec and payload
    against the payload the same all-reduce sends uncompressed (lowcomm's OpStats)."""
    op = r["last_outer_op"]
    assert op["codec"] == "q4", op
    assert op["payload_bytes_sent"] * 32 <= Q4_BITS * op["uncompressed_bytes_sent"], op
    return op


def pipeline_bits(run, epochs, warmup_epochs=0):
    """Bits per activation element one micro-batch puts on the link, forward and backward,
    averaged over the epochs (each has the same steps): activations at b bits, exact (32) in
    the --warmup-epochs and, for AQ-SGD, in a sample's first epoch after them; gradients at
    the /bw bits (8 by default); fp32 both ways at 32."""
    if run == "fp32":
        return 64
    m = re.fullmatch(r"(direct|aqsgd)(\d)(?:/bw(\d)(?:sr)?)?", run)
    exact = warmup_epochs + (m[1] == "aqsgd")
    forward = (32 * exact + int(m[2]) * (epochs - exact)) / epochs
    return forward + int(m[3] or 8)


def check_pipeline_bytes(r, args):
    """The run's measured bytes per micro-batch (both stages, codes, scales and the link's
    headers) are those of its bits, scales and headers adding at most 2%."""
    elements = args["micro_batch"] * gpt.QUICK.seq * gpt.QUICK.d_model
    codes = elements * pipeline_bits(r["run"], args["epochs"], args["warmup_epochs"]) / 8
    assert codes <= r["bytes_per_micro_batch"] <= 1.02 * codes, (r["run"], codes, r)


def test_diloco_quick(tmp_path):
    out = tmp_path / "diloco"
    text = run([EXAMPLES / "diloco_train.py", "--quick", "--runs", "q4+ef", "--out", out],
               tmp_path)
    assert "val loss" in text and "compute utilisation" in text and "codec q4" in text
    (r,) = check_outputs(out, "diloco", ["q4+ef"])
    op = check_q4_outer_steps(r)
    # Every outer step, every worker, headers included (one fragment: the last all-reduce is
    # a whole outer step's).
    assert r["bytes_per_outer_step"] * 32 <= Q4_BITS * op["uncompressed_bytes_sent"], r


def test_pipeline_quick(tmp_path):
    out = tmp_path / "pipeline"
    text = run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--runs", "aqsgd2,direct2", "--out",
                out], tmp_path)
    assert "kB per micro-batch" in text
    aq, direct = check_outputs(out, "pipeline", ["aqsgd2", "direct2"])
    assert aq["cache_bytes_per_sample"] > 0 and direct["cache_bytes_per_sample"] == 0
    args = json.loads((out / "results.json").read_text())["args"]
    for r in (aq, direct):
        check_pipeline_bytes(r, args)


def test_pipeline_fine_tuning_with_channel_scales_and_4_bit_gradients(tmp_path):
    out = tmp_path / "finetune"
    text = run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--pretrain", "40", "--shift",
                "swapcase", "--scales", "channel", "--runs", "fp32,aqsgd2/bw4", "--out", out],
               tmp_path)
    assert "pretrained seed 1: 40 steps" in text and "before fine-tuning" in text
    doc = json.loads((out / "results.json").read_text())
    results = doc["results"]
    assert [r["run"] for r in results] == ["fp32", "aqsgd2/bw4"]
    for r in results:  # both fine-tune the same pretrained model: the same starting loss
        assert r["curve"][0][2] == results[0]["curve"][0][2]
        assert r["final_val_loss"] < r["curve"][0][2] - 0.3, r
        check_pipeline_bytes(r, doc["args"])


def test_report_relabels_and_plots(tmp_path):
    out = tmp_path / "pipe"
    run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--runs", "fp32,direct2", "--rotate",
         "--warmup-epochs", "1", "--out", out], tmp_path)
    doc = json.loads((out / "results.json").read_text())
    for r in doc["results"]:  # exact activations in the warm-up epoch, then 2 bits
        check_pipeline_bytes(r, doc["args"])
        assert r["final_val_loss"] < r["curve"][0][2] - 1.0, r
    text = run([EXAMPLES / "report.py", "--plot", tmp_path / "cmp", str(out),
                f"{out}=again"], tmp_path)
    assert "| fp32 | 1 |" in text and "| again fp32 | 1 |" in text
    assert "| direct2 | 1 |" in text and "| again direct2 | 1 |" in text
    for suffix in ("-loss-vs-step.png", "-loss-vs-wall.png"):
        assert (tmp_path / f"cmp{suffix}").stat().st_size > 1000


def test_diloco_streaming_quick(tmp_path):
    out = tmp_path / "streaming"
    text = run([EXAMPLES / "diloco_train.py", "--quick", "--runs", "q4", "--fragments", "2",
                "--delay", "2", "--outer-momentum", "0.5", "--out", out], tmp_path)
    assert "2 fragments, delay 2, alpha 0.5" in text
    (r,) = check_outputs(out, "diloco", ["q4"])
    check_q4_outer_steps(r)  # the last fragment's all-reduce
    assert json.loads((out / "results.json").read_text())["args"]["outer_momentum"] == 0.5


def test_opendiloco_style_script_with_only_the_backend_changed(tmp_path):
    text = run([EXAMPLES / "existing" / "opendiloco_style.py", "--spawn", "2", "--steps", "20",
                "--local-steps", "5"], tmp_path,
               env={"LOWCOMM_CODEC": "q4", "LOWCOMM_CODEC_THRESHOLD": "0",
                    "LOWCOMM_ERROR_FEEDBACK": "order", "LOWCOMM_DIRECT_BYTES": "65536"})
    assert "outer step median" in text
    # Rank 0's line per outer step: its training loss, and what its all-reduces put on the wire
    # against the same all-reduces uncompressed, and their codecs.
    steps = re.findall(r"^step \d+: loss ([\d.]+), .*, ([\d.]+) kB payload sent, ([\d.]+) kB "
                       r"uncompressed, codec (\S+)\)$", text, re.M)
    assert len(steps) == 4, text
    for _, sent, uncompressed, codec in steps:
        assert codec == "q4", text
        assert float(sent) * 32 <= Q4_BITS * float(uncompressed), text
    assert float(steps[-1][0]) < float(steps[0][0]) - 1.0, text


def test_pipelining_trainer_over_an_aqsgd_link(tmp_path):
    text = run([EXAMPLES / "existing" / "pipelining_aqsgd.py", "--samples", "64", "--epochs",
                "3"], tmp_path)
    epochs = re.findall(r"^epoch \d+: train loss ([\d.]+), .*, link ([\d.]+) kB received$",
                        text, re.M)
    losses = [float(loss) for loss, _ in epochs]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3, text
    # Stage 1 receives every sample's activation exactly in epoch 0 (AQ-SGD's first
    # appearance: 64 samples of fp32), then 2-bit deltas: 1/16 of that, with the 32-bit scale
    # per 1024 elements and the link's headers well under 1/14.
    received = [float(kb) for _, kb in epochs]
    fp32_kb = 64 * gpt.QUICK.seq * gpt.QUICK.d_model * 4 / 1e3
    assert fp32_kb <= received[0] <= 1.02 * fp32_kb, text
    for before, after in zip(received, received[1:]):
        assert (after - before) * 14 <= received[0], text
