#!/usr/bin/env bash
# Installs the Debian packages lowcomm builds and tests with, skipping those already present.
# Idempotent: a second run does no network I/O.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  clang llvm libclang-rt-dev       # libFuzzer and the sanitizer runtimes
  clang-format                     # scripts/format.sh (checked by scripts/test.sh)
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev
  libssl-dev                       # OpenSSL 3: HMAC authentication of transport streams
  libzstd-dev liblz4-dev           # lossless stream compression (plugins/nccl_net)
  libucx-dev                       # UCX inside a site (optional in the build: LOWCOMM_UCX)
  iproute2 iperf3                  # scripts/wan_netns.sh: namespaces, veth, tbf; its selftest
  nftables                         # scripts/elastic_netns.sh: partitions between namespaces
  iptables libnetfilter-queue-dev  # wan_netns.sh --delay without netem (lowcomm-wan-delay)
  openmpi-bin libopenmpi-dev       # Open MPI 4.1 baseline (scripts/baselines/mpi_allreduce.sh)
  python3-matplotlib               # lowcomm-bench --plot (bench/plot_bench.py)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The torch backend (plugins/torch): PyTorch from PyPI and pytest in a git-ignored virtual
# environment, .venv. The wheel runs on machines without a GPU.
TORCH_VERSION=${LOWCOMM_TORCH_VERSION:-2.15.0}
if ! .venv/bin/python -c "import torch, numpy, pytest, setuptools, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; then
  echo "deps: installing torch $TORCH_VERSION and pytest into .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "torch==$TORCH_VERSION" numpy pytest setuptools wheel
fi

# PyTorch's distributed suite (scripts/torch_suite.sh) imports expecttest and hypothesis; the
# training examples (examples/) plot with matplotlib.
if ! .venv/bin/python -c "import expecttest, hypothesis, matplotlib" 2>/dev/null; then
  echo "deps: installing expecttest, hypothesis and matplotlib into .venv"
  .venv/bin/pip install -q expecttest hypothesis matplotlib
fi
# torchft (lowcomm.torchft; plugins/torch/tests/test_torchft.py runs torchft's own integration
# tests, which import parameterized, on lowcomm). Its torch requirement is met by the one above.
if ! .venv/bin/python -c "import torchft, parameterized" 2>/dev/null; then
  echo "deps: installing torchft 0.2.0 and parameterized into .venv"
  .venv/bin/pip install -q "torchft==0.2.0" parameterized
fi

# The oldest torch the backend supports, tested by scripts/test.sh too: 2.11, what the GPU
# machines carry. LOWCOMM_TORCH_OLDEST=none skips it.
OLDEST=${LOWCOMM_TORCH_OLDEST:-2.11.0}
if [ "$OLDEST" != none ] && ! .venv-torch-oldest/bin/python -c "import torch, numpy, pytest, setuptools, sys; sys.exit(torch.__version__.split('+')[0] != '$OLDEST')" 2>/dev/null; then
  echo "deps: installing torch $OLDEST (the oldest supported) and pytest into .venv-torch-oldest"
  python3 -m venv .venv-torch-oldest
  .venv-torch-oldest/bin/pip install -q --upgrade pip
  .venv-torch-oldest/bin/pip install -q "torch==$OLDEST" numpy pytest setuptools wheel
fi
