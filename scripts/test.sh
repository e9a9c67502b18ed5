#!/usr/bin/env bash
# The test suite: build, then every ctest label (unit, oracle, e2e; gpu tests report themselves
# skipped without a GPU), then each libFuzzer target for FUZZ_SECONDS (default 20) on the
# safetensors and config parsers.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build_dir=${BUILD_DIR:-build}
(cd "$build_dir" && ctest --output-on-failure -j "$(nproc)")
bash fuzz/run_fuzzers.sh "${build_dir}-fuzz" "${FUZZ_SECONDS:-20}"
