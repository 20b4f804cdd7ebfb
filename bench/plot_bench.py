"""Plots lowcomm-bench's CSV: time against size, one line per codec (and per library), log-log,
with each codec's link-limit time dashed where the CSV has one.

  /usr/bin/python3 bench/plot_bench.py results.csv plot.png
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    series = {}
    limits = {}
    title = ""
    with open(argv[1], newline="") as f:
        for row in csv.DictReader(f):
            name = row["codec"] + (" +ef" if row.get("ef") == "1" else "")
            if row.get("library", "lowcomm") != "lowcomm":
                name = row["library"]
            size, t = int(row["bytes"]), float(row["time_s"])
            series.setdefault(name, []).append((size, t))
            lim = float(row.get("limit_s") or 0)
            if lim > 0:
                limits.setdefault(name, []).append((size, lim))
            title = f'{row["collective"]}, {row["ranks"]} ranks, link: {row.get("link", "?")}'
    if not series:
        print(f"plot_bench: no rows in {argv[1]}", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in series.items():
        pts.sort()
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        if name in limits:
            lp = sorted(limits[name])
            ax.plot([p[0] for p in lp], [p[1] for p in lp], linestyle="--", color=line.get_color(),
                    alpha=0.6, label=f"{name} link limit")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("time (s), slowest rank, median")
    ax.set_title(f"lowcomm-bench: {title}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(argv[2], dpi=110)
    print(f"plot_bench: wrote {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
