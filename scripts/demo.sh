#!/usr/bin/env bash
# The main job: install what is missing, build (Release), run the codec demo.
#   scripts/demo.sh [demo arguments, e.g. --elements 4194304 --threads 2]
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target lowcomm-codec-demo
build/bin/lowcomm-codec-demo "$@"
