#!/usr/bin/env python3
"""Turns lowcomm-codec-bench's Google Benchmark JSON (the cuda/ cases of
bench/cuda_codec_bench.cc) into kernels.json and a markdown table (docs/gpu.md).

    kernels_report.py RAW.json OUT.json [TABLE.md]

Effective bandwidth of a case: the bytes the op must read plus write in device memory, each
counted once (the bench's rw_bytes: inputs, codes and scales, state, outputs), over the median
time per call (of 100, after a warm-up); `vs_copy` is that over the read + write rate of a 256 MiB device-to-device copy
measured in the same process (2 x 256 MiB per copy). Targets: 0.80 of the copy for the dense
codecs' kernels, 0.50 for the sparse codecs' selection (topk, randk). Exit status 0 when the
JSON was read (targets missed included), 1 when it could not be, or holds no cuda/ case.
"""
import json
import sys

DENSE_TARGET = 0.80
SPARSE_TARGET = 0.50
OP_ORDER = ["encode", "encode_ef", "encode_delta", "decode", "decode_accumulate", "decode_delta"]


def parse_name(name):
    """cuda/<op>/<dtype>/<codec>/<rn|sr>/256MiB[/iterations:N][/manual_time] -> dict, or None."""
    parts = [p for p in name.split("/") if p != "manual_time" and not p.startswith("iterations:")]
    if len(parts) != 6 or parts[0] != "cuda":
        return None
    return {"op": parts[1], "dtype": parts[2], "codec": parts[3], "rounding": parts[4]}


def target_of(codec):
    return SPARSE_TARGET if codec.startswith(("topk", "randk")) else DENSE_TARGET


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        print(f"kernels_report: cannot read {argv[1]}: {e}", file=sys.stderr)
        return 1
    copy, cases, errors = None, [], []
    for b in raw.get("benchmarks", []):
        name = b.get("name", "")
        if b.get("error_occurred"):
            errors.append({"name": name, "error": b.get("error_message", "")})
            continue
        if name.startswith("cuda/d2d_copy/"):
            copy = {"ms": b.get("median_ms"), "rw_GBps": b.get("rw_GB/s"),
                    "tensor_GBps": b.get("tensor_GB/s")}
            continue
        fields = parse_name(name)
        if fields is None:
            continue
        vs = b.get("vs_copy")
        target = target_of(fields["codec"])
        fields.update({
            "name": name, "ms": b.get("median_ms"), "mean_ms": b.get("real_time"),
            "iterations": b.get("iterations"),
            "tensor_GBps": b.get("tensor_GB/s"), "rw_GBps": b.get("rw_GB/s"),
            "rw_bytes": b.get("rw_bytes"), "vs_copy": vs, "target": target,
            "meets_target": vs is not None and vs >= target,
        })
        cases.append(fields)
    if not cases and not errors:
        print("kernels_report: no cuda/ case in the JSON", file=sys.stderr)
        return 1
    met = sum(c["meets_target"] for c in cases)
    report = {
        "tensor_bytes": 256 << 20,
        "bandwidth": "bytes read + written by the op, each once (rw_bytes), over the median "
                     "time per call (ms); vs_copy: over a 256 MiB device-to-device copy's read "
                     "+ write rate in the same run",
        "targets": {"dense": DENSE_TARGET, "sparse_selection": SPARSE_TARGET},
        "copy": copy,
        "met": met,
        "cases_run": len(cases),
        "cases": cases,
        "errors": errors,
        "context": raw.get("context", {}),
    }
    with open(argv[2], "w") as f:
        json.dump(report, f, indent=1)
    table = render(copy, cases, errors, met)
    if len(argv) > 3:
        with open(argv[3], "w") as f:
            f.write(table)
    else:
        sys.stdout.write(table)
    return 0


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def render(copy, cases, errors, met):
    lines = []
    if copy:
        lines.append(f"D2D copy, 256 MiB: {fmt(copy['ms'], '.3f')} ms, "
                     f"{fmt(copy['rw_GBps'], '.0f')} GB/s read + written.\n")
    lines.append("| op | codec | rounding | fp32 ms | fp32 GB/s | fp32 / copy | bf16 ms | "
                 "bf16 GB/s | bf16 / copy | target |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for c in cases:
        rows.setdefault((c["op"], c["codec"], c["rounding"]), {})[c["dtype"]] = c

    def order(key):
        op, codec, rnd = key
        sparse = codec.startswith(("topk", "randk"))
        return (sparse, OP_ORDER.index(op) if op in OP_ORDER else 99, codec, rnd)

    for key in sorted(rows, key=order):
        op, codec, rnd = key
        cells = [op, codec, rnd]
        for dtype in ("fp32", "bf16"):
            c = rows[key].get(dtype)
            if c is None:
                cells += ["", "", ""]
                continue
            mark = "" if c["meets_target"] else " ✗"
            cells += [fmt(c["ms"], ".3f"), fmt(c["rw_GBps"], ".0f"),
                      fmt(c["vs_copy"], ".2f") + mark]
        cells.append(f"{target_of(codec):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\nTargets met: {met} of {len(cases)} cases (✗: below target).")
    for e in errors[:5]:
        lines.append(f"- error: {e['name']}: {e['error']}")
    if len(errors) > 5:
        lines.append(f"- and {len(errors) - 5} more errors (kernels.json)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
