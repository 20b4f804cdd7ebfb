#!/usr/bin/env python3
"""Markdown tables from the examples' results.json files: per run, the mean final validation
loss over seeds, its gap to the run named as the reference (fp32), bytes, wall time and
compute utilisation.

    .venv/bin/python examples/report.py results/diloco-quality [more result dirs...]
"""
import json
import statistics
import sys
from pathlib import Path


def load(dirs):
    rows, kind = [], None
    for d in dirs:
        data = json.loads((Path(d) / "results.json").read_text())
        for r in data["results"]:
            r["_dir"] = str(d)
            kind = "pipeline" if "bytes_per_micro_batch" in r else "diloco"
            rows.append(r)
    return rows, kind


def table(rows, kind):
    runs = {}
    for r in rows:
        runs.setdefault(r["run"], []).append(r)
    ref = statistics.mean(r["final_val_loss"] for r in runs.get("fp32", rows))
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


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    rows, kind = load(sys.argv[1:])
    table(rows, kind)


if __name__ == "__main__":
    main()
