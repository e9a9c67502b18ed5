#!/usr/bin/env bash
# Thirty-ninth session, the short form of run165 for the last ~300 s of device time: the split and
# stream-K GEMM tests (stream-K's first GPU run), then every dense shape at M = 1,024 forced to
# 128 x 256 pairs with and without stream-K, and the table. Same pack and carry as run165.
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
timeout 100 $B/tests/ops/ops_cuda_test --gtest_filter='*StreamK*:*Split*' > $L/ops_sk.txt 2>&1
echo "ops stream-K/split tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_sk.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]" $L/ops_sk.txt | head -5 >> $S
for cfg in 128x256/skc2 128x256/1c2; do
  f=sk.1024.${cfg//\//_}
  timeout 60 $B/apps/fanout bench kernels --no-grouped --m 1024 --config $cfg --json $L/$f.json > $L/$f.txt 2>&1
  echo "m1024 forced $cfg rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A12 '^shape' $L/$f.txt | head -14 >> $S
done
kernels_line "r1 new" m1024.new.1 $B/apps/fanout 1024
cat $S
