#!/usr/bin/env python3
"""Which table each installed NCCL takes from libnccl-net-lowcomm.so, checked without a GPU.

NCCL dlopens the plugin and looks up ncclNetPlugin_v<N> for N from its newest version down,
keeping the first it finds. The versions a libnccl.so.2 probes are the names it holds; this
reads them (and the release) from each NCCL library found, emulates the lookup against the
plugin's dynamic symbol table, and fails unless every NCCL finds its own newest version (so
nothing goes through an older, narrower table) and the plugin exports nothing else.

    probe_order.py --plugin build/lib/libnccl-net-lowcomm.so [--nccl path/libnccl.so.2 ...]
Without --nccl: the CUDA toolkit's and the repository virtual environment's (torch's) NCCL.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def default_nccls():
    found = []
    for pattern in ("/usr/local/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib/libnccl.so.2",
                    os.path.join(ROOT, ".venv/lib/python*/site-packages/nvidia/nccl/lib/libnccl.so.2")):
        for path in sorted(glob.glob(pattern)):
            real = os.path.realpath(path)
            if real not in [os.path.realpath(p) for p in found]:
                found.append(path)
    return found


def probed_versions(path):
    data = open(path, "rb").read()
    versions = sorted({int(v) for v in re.findall(rb"\x00ncclNetPlugin_v(\d+)\x00", data)},
                      reverse=True)
    release = re.search(rb"NCCL version (\d+\.\d+\.\d+)", data)
    return (release.group(1).decode() if release else "?"), versions


def exported(plugin):
    out = subprocess.run(["nm", "-D", "--defined-only", plugin], check=True,
                         capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.strip()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin", required=True)
    ap.add_argument("--nccl", action="append")
    args = ap.parse_args()
    symbols = exported(args.plugin)
    problems = []
    extra = sorted(s for s in symbols if not re.fullmatch(r"ncclNetPlugin_v\d+", s))
    if extra:
        problems.append(f"the plugin exports more than its tables: {extra[:10]}")
    ncclls = args.nccl or default_nccls()
    if not ncclls:
        problems.append("no NCCL library found to check against")
    for path in ncclls:
        release, versions = probed_versions(path)
        if not versions:
            problems.append(f"{path}: no ncclNetPlugin_v<N> names in it")
            continue
        taken = next((v for v in versions if f"ncclNetPlugin_v{v}" in symbols), None)
        order = ", ".join(f"v{v}" for v in versions)
        print(f"NCCL {release} ({path}) probes {order}: takes "
              f"{'ncclNetPlugin_v%d' % taken if taken else 'nothing'}")
        if taken != versions[0]:
            problems.append(f"NCCL {release} would take v{taken}, not its newest v{versions[0]}")
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
