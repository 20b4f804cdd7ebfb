#!/usr/bin/env bash
# Runs PyTorch's distributed test suite (the one PyTorch runs for Gloo) on Gloo and on lowcomm,
# 2 ranks on CPU, and writes OUT/gloo.json, OUT/lowcomm.json and OUT/summary.md
# (plugins/torch/tests/torch_suite/run_suite.py; docs/torch.md, "PyTorch's distributed suite").
# About 20-40 minutes per backend on a 2-core machine; not part of scripts/test.sh. Exits
# non-zero when a test fails that is expected to pass (run_suite.py, KNOWN_FAILURES).
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
# Both backends run and the summary is written whatever fails; the exit status is non-zero when
# any step failed: a test outside run_suite.py's KNOWN_FAILURES failed, a known failure did not
# fail as listed, or Gloo passes a test lowcomm does not (and that is not a known failure).
failed=()
for backend in gloo lowcomm; do
  "$python" "$root/plugins/torch/tests/torch_suite/run_suite.py" --backend "$backend" \
    --out "$out" "$@" || failed+=("$backend")
done
"$python" "$root/plugins/torch/tests/torch_suite/run_suite.py" --compare "$out" ||
  failed+=(compare)
if [ ${#failed[@]} -gt 0 ]; then
  echo "torch_suite: FAILED: ${failed[*]} (details above and in $out)" >&2
  exit 1
fi
