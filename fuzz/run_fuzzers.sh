#!/usr/bin/env bash
# Builds the libFuzzer targets with clang and runs each for SECONDS.
#
#   fuzz/run_fuzzers.sh BUILD_DIR SECONDS
#
# Each fuzzer starts from its checked-in seeds (fuzz/corpus/NAME/, never written to) plus the
# inputs it found on earlier runs (BUILD_DIR/fuzz-work/NAME/corpus/). A crash, sanitizer report,
# leak or timeout leaves the input in BUILD_DIR/fuzz-work/NAME/artifacts/ and makes the script
# exit non-zero, after every fuzzer has run. Reproduce one with: BUILD_DIR/fuzz/NAME_fuzz ARTIFACT
set -euo pipefail

if [[ $# -ne 2 || ! $2 =~ ^[0-9]+$ ]]; then
    echo "usage: $0 BUILD_DIR SECONDS" >&2
    exit 2
fi
build_dir=$1
seconds=$2
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

CC=clang CXX=clang++ cmake -S "$root" -B "$build_dir" -G Ninja -DFANOUT_WITH_CUDA=OFF \
    -DFANOUT_BUILD_FUZZERS=ON -DFANOUT_BUILD_TESTS=OFF -DFANOUT_BUILD_BENCH=OFF >/dev/null
ninja -C "$build_dir" safetensors_fuzz config_fuzz tokenizer_fuzz http_fuzz

failed=()
for name in safetensors config tokenizer http; do
    work="$build_dir/fuzz-work/$name"
    rm -rf "$work/artifacts"
    mkdir -p "$work/corpus" "$work/artifacts"
    echo "=== ${name}_fuzz: ${seconds}s ==="
    dict=""; [[ -f $root/fuzz/$name.dict ]] && dict=$root/fuzz/$name.dict
    # The first corpus folder receives new inputs; the seeds folder is only read.
    if ! "$build_dir/fuzz/${name}_fuzz" "$work/corpus" "$root/fuzz/corpus/$name" \
        ${dict:+-dict="$dict"} -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$work/artifacts/" -print_final_stats=1 2>"$work/log"; then
        failed+=("$name")
    fi
    grep -E "^(stat::|Done|==[0-9]+==ERROR|SUMMARY)" "$work/log" || true
    if compgen -G "$work/artifacts/*" >/dev/null; then
        echo "artifacts:"
        ls -1 "$work/artifacts/"
    fi
done

if [[ ${#failed[@]} -gt 0 ]]; then
    echo "FAILED: ${failed[*]} (logs in $build_dir/fuzz-work/NAME/log)" >&2
    exit 1
fi
echo "all fuzzers ran ${seconds}s without a finding"
