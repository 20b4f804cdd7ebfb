"""Loss curves of several runs, as PNG plots and CSV, for the examples' reports.

``runs`` maps a label (say ``"diloco H=50 int8"``) to a list of ``(step, wall_s, val_loss)``.
Two plots, because low-communication methods trade one for the other: validation loss against
step (does compression hurt learning?) and against wall time (does it pay off on a slow
link?). matplotlib's Agg backend is used, so no display is needed.
"""

from __future__ import annotations

import csv
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

Runs = dict[str, list[tuple[int, float, float]]]


def write_curves(path_prefix: str | Path, runs: Runs, title: str = "") -> list[Path]:
    """Writes ``<prefix>-loss-vs-step.png`` and ``<prefix>-loss-vs-wall.png``; returns them."""
    prefix = Path(path_prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    written = []
    for column, xlabel, suffix in ((0, "step", "step"), (1, "wall time (s)", "wall")):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for label, points in runs.items():
            ax.plot([p[column] for p in points], [p[2] for p in points], marker=".", label=label)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("validation loss (nats/byte)")
        if title:
            ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = prefix.with_name(f"{prefix.name}-loss-vs-{suffix}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def write_csv(path: str | Path, runs: Runs) -> Path:
    """One row per point: ``label,step,wall_s,val_loss``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "step", "wall_s", "val_loss"])
        for label, points in runs.items():
            for step, wall_s, val_loss in points:
                w.writerow([label, step, f"{wall_s:.3f}", f"{val_loss:.4f}"])
    return path


def write_results(out_dir, name, args, results) -> None:
    """An example's outputs: results.json (its arguments and every run) and, from each run's
    (step, wall_s, val_loss) curve, `<name>-loss-vs-step.png`, `<name>-loss-vs-wall.png` and
    `<name>.csv`."""
    import json
    import os

    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"args": vars(args), "results": results}, f, indent=1)
    curves = {f"{r['run']} s{r['seed']}": [tuple(c) for c in r["curve"]] for r in results}
    write_curves(os.path.join(out_dir, name), curves)
    write_csv(os.path.join(out_dir, f"{name}.csv"), curves)
