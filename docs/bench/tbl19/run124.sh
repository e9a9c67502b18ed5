#!/usr/bin/env bash
# Twenty-fifth session: the masked grouped GEMM's default in cluster pairs from 1,024 expected
# rows per expert (EP128 and up) against head (fanout_head, a4ca88a's code): the grouped GPU
# tests, then `bench kernels --no-dense` and `bench layer --eps 128` at batch 128, alternating.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
for i in 1 2; do
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
  run_line "grouped old $i" grouped.old.$i $B/fanout_head bench kernels --no-dense --json $L/grouped.old.$i.json
  run_line "layer new $i" layer.new.$i $B/apps/fanout bench layer --batches 32,128 --eps 128 --replays 10 --json $L/layer.new.$i.json
  run_line "layer old $i" layer.old.$i $B/fanout_head bench layer --batches 32,128 --eps 128 --replays 10 --json $L/layer.old.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
