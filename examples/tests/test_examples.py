"""The training examples' --quick modes, run as a user runs them (separate processes, the
lowcomm backend, DiLoCo with q4 and error feedback; the pipeline with AQ-SGD 2-bit and direct
2-bit): each finishes, beats an untrained model's validation loss by a wide margin, and writes
its loss PNGs, CSV and results.json. The OpenDiLoCo-style script runs with only the backend
line changed, compressed with call-order error feedback and one-hop all-reduces from the
group's options (the environment)."""
import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1]


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


def test_diloco_quick(tmp_path):
    out = tmp_path / "diloco"
    text = run([EXAMPLES / "diloco_train.py", "--quick", "--runs", "q4+ef", "--out", out],
               tmp_path)
    assert "val loss" in text and "compute utilisation" in text
    (r,) = check_outputs(out, "diloco", ["q4+ef"])
    assert r["bytes_per_outer_step"] > 0


def test_pipeline_quick(tmp_path):
    out = tmp_path / "pipeline"
    text = run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--runs", "aqsgd2,direct2", "--out",
                out], tmp_path)
    assert "kB per micro-batch" in text
    aq, direct = check_outputs(out, "pipeline", ["aqsgd2", "direct2"])
    assert aq["cache_bytes_per_sample"] > 0 and direct["cache_bytes_per_sample"] == 0


def test_pipeline_fine_tuning_with_channel_scales_and_4_bit_gradients(tmp_path):
    out = tmp_path / "finetune"
    text = run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--pretrain", "40", "--shift",
                "swapcase", "--scales", "channel", "--runs", "fp32,aqsgd2/bw4", "--out", out],
               tmp_path)
    assert "pretrained seed 1: 40 steps" in text and "before fine-tuning" in text
    results = json.loads((out / "results.json").read_text())["results"]
    assert [r["run"] for r in results] == ["fp32", "aqsgd2/bw4"]
    for r in results:  # both fine-tune the same pretrained model: the same starting loss
        assert r["curve"][0][2] == results[0]["curve"][0][2]
        assert r["final_val_loss"] < r["curve"][0][2] - 0.3, r


def test_report_relabels_and_plots(tmp_path):
    out = tmp_path / "pipe"
    run([EXAMPLES / "pipeline_aqsgd.py", "--quick", "--runs", "fp32,direct2", "--rotate",
         "--warmup-epochs", "1", "--out", out], tmp_path)
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
    check_outputs(out, "diloco", ["q4"])
    assert json.loads((out / "results.json").read_text())["args"]["outer_momentum"] == 0.5


def test_opendiloco_style_script_with_only_the_backend_changed(tmp_path):
    text = run([EXAMPLES / "existing" / "opendiloco_style.py", "--spawn", "2", "--steps", "20",
                "--local-steps", "5"], tmp_path,
               env={"LOWCOMM_CODEC": "q4", "LOWCOMM_CODEC_THRESHOLD": "0",
                    "LOWCOMM_ERROR_FEEDBACK": "order", "LOWCOMM_DIRECT_BYTES": "65536"})
    assert "outer step median" in text


def test_pipelining_trainer_over_an_aqsgd_link(tmp_path):
    text = run([EXAMPLES / "existing" / "pipelining_aqsgd.py", "--samples", "64", "--epochs",
                "3"], tmp_path)
    losses = [float(line.split("train loss ")[1].split(",")[0])
              for line in text.splitlines() if line.startswith("epoch")]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.3, text
