#!/usr/bin/env bash
# Runs PyTorch's distributed test suite (the one PyTorch runs for Gloo) on Gloo and on lowcomm,
# 2 ranks on CPU, and writes OUT/gloo.json, OUT/lowcomm.json and OUT/summary.md
# (plugins/torch/tests/torch_suite/run_suite.py; docs/torch.md, "PyTorch's distributed suite").
# About 20-40 minutes per backend on a 2-core machine; not part of scripts/test.sh.
#   scripts/torch_suite.sh [OUT] [-- extra run_suite.py arguments, e.g. -k allreduce]
# Needs scripts/deps.sh (.venv with torch, expecttest, hypothesis) and the plugin installed in
# .venv (docs/torch.md, Install), or PYTHON and PYTHONPATH pointing at another installation.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/build/torch_suite}")
shift || true
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-$root/.venv/bin/python}
mkdir -p "$out"
cd /tmp  # import the installed lowcomm package, not plugins/torch/lowcomm
for backend in gloo lowcomm; do
  "$python" "$root/plugins/torch/tests/torch_suite/run_suite.py" --backend "$backend" \
    --out "$out" "$@"
done
"$python" "$root/plugins/torch/tests/torch_suite/run_suite.py" --compare "$out"
