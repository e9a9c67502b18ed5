#!/usr/bin/env bash
# Twenty-sixth session, first device call: run127 (the 128 × 192 grouped tiles of masked_192.patch,
# patched binary against head, alternating) plus head's GEMM and model suites, which hold the two
# files the twenty-fifth session changed without a GPU (MaskedSmallWidths in pairs, the layer's
# one-division expected tokens). Carry as run127 says.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test head
test_line model/model_cuda_test head
test_line ../ops_cuda_test_m192 m192
for i in 1 2; do
  run_line "grouped m192 $i" grouped.m192.$i $B/fanout_m192 bench kernels --no-dense --json $L/grouped.m192.$i.json
  run_line "grouped head $i" grouped.head.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.head.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
