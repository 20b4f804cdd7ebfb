#!/usr/bin/env python3
"""Markdown tables from the examples' results.json files: per run, the mean final validation
loss over seeds, its gap to the reference (the first run named fp32, or "<label> fp32"),
bytes, wall time and compute utilisation.

    .venv/bin/python examples/report.py results/diloco-quality [more result dirs...]
    .venv/bin/python examples/report.py docs/results/aqsgd/finetune-block2.json  # a file
    .venv/bin/python examples/report.py --plot docs/img/t2 results/t2/none \
        "results/t2/tau1=q4 tau 1" ...

A directory given as DIR=LABEL names its runs "LABEL" (its run name after a space when it
holds several), so runs of the same codec in different settings stay apart; the gaps are to
the first fp32 run given ("fp32" or "LABEL fp32"). --plot PREFIX
also writes PREFIX-loss-vs-step.png and PREFIX-loss-vs-wall.png: each run's validation loss
curve averaged over its seeds, side by side.
"""
import json
import statistics
import sys
from pathlib import Path


def load(dirs):
    rows, kind = [], None
    for arg in dirs:
        d, label = arg, ""
        if not Path(arg).exists() and "=" in arg:
            d, _, label = arg.rpartition("=")
        path = Path(d) if Path(d).is_file() else Path(d) / "results.json"
        data = json.loads(path.read_text())
        names = {r["run"] for r in data["results"]}
        for r in data["results"]:
            r["_dir"] = str(d)
            if label:
                r["run"] = label if len(names) == 1 else f"{label} {r['run']}"
            kind = "pipeline" if "bytes_per_micro_batch" in r else "diloco"
            rows.append(r)
    return rows, kind


def table(rows, kind):
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(r)
    fp32 = [name for name in runs if name == "fp32" or name.endswith(" fp32")]
    ref = statistics.mean(r["final_val_loss"] for r in (runs[fp32[0]] if fp32 else rows))
    if kind == "diloco":
        print("| run | seeds | val loss (mean) | per seed | gap to fp32 | MB sent per worker per "
              "outer step | wall s (mean) | compute utilisation (min) |")
        print("|---|---|---|---|---|---|---|---|")
    else:
        print("| run | seeds | val loss (mean) | per seed | gap to fp32 | kB per micro-batch "
              "(both ways) | step ms after epoch 1 (mean) | wall s (mean) |")
        print("|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        loss = statistics.mean(r["final_val_loss"] for r in rs)
        per = " / ".join(f"{r['final_val_loss']:.4f}" for r in sorted(rs, key=lambda r: r["seed"]))
        gap = 100 * (loss - ref) / ref
        wall = statistics.mean(r["wall_s"] for r in rs)
        if kind == "diloco":
            mb = statistics.mean(r["bytes_per_outer_step"] for r in rs) / 1e6
            util = min(r["utilisation"] for r in rs)
            print(f"| {name} | {len(rs)} | {loss:.4f} | {per} | {gap:+.2f}% | {mb:.3f} | "
                  f"{wall:.1f} | {100 * util:.1f}% |")
        else:
            kb = statistics.mean(r["bytes_per_micro_batch"] for r in rs) / 1e3
            step = statistics.mean(r["step_s_after_first_epoch"] for r in rs) * 1e3
            print(f"| {name} | {len(rs)} | {loss:.4f} | {per} | {gap:+.2f}% | {kb:.1f} | "
                  f"{step:.0f} | {wall:.1f} |")


def mean_curves(rows):
    """Per run: (step, wall_s, val_loss) averaged over its seeds, point by point."""
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(r["curve"])
    out = {}
    for name, curves in runs.items():
        n = min(len(c) for c in curves)
        out[f"{name} ({len(curves)} seeds)"] = [
            (curves[0][i][0], statistics.mean(c[i][1] for c in curves),
             statistics.mean(c[i][2] for c in curves)) for i in range(n)]
    return out


def main():
    args = sys.argv[1:]
    plot_prefix = None
    if args and args[0] == "--plot":
        if len(args) < 2:
            raise SystemExit(__doc__)
        plot_prefix, args = args[1], args[2:]
    if not args:
        raise SystemExit(__doc__)
    rows, kind = load(args)
    table(rows, kind)
    if plot_prefix:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from lowcomm_examples import plot
        plot.write_curves(plot_prefix, mean_curves(rows))


if __name__ == "__main__":
    main()
