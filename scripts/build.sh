#!/usr/bin/env bash
# Installs the Debian packages fanout needs (scripts/install_deps.sh) and builds it into
# BUILD_DIR (default: build) with CMake + Ninja. CUDA targets join when nvcc is found
# (under /usr/local/cuda too). Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
scripts/install_deps.sh
if [[ -x /usr/local/cuda/bin/nvcc ]] && ! command -v nvcc >/dev/null; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release ${FANOUT_CMAKE_ARGS:-} >/dev/null
ninja -C "$build_dir"
