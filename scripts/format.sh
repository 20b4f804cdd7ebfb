#!/usr/bin/env bash
# Checks (default) or applies (--fix) .clang-format on every tracked C, C++ and CUDA file.
# scripts/test.sh runs the check first, so unformatted code fails the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run -Werror "${files[@]}" 2>/tmp/lowcomm-format.$$; then
  grep -E '^[^ ].*: (error|warning):' /tmp/lowcomm-format.$$ | cut -d: -f1 | sort -u |
    sed 's/^/format: not formatted: /'
  rm -f /tmp/lowcomm-format.$$
  echo "format: run scripts/format.sh --fix ($(clang-format --version))" >&2
  exit 1
fi
rm -f /tmp/lowcomm-format.$$
echo "format: ${#files[@]} files match .clang-format"
