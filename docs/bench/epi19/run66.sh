#!/usr/bin/env bash
# Pairs along N sharing x (64x64/2n2 ...): the GEMM tests; sweeps at M = 64 and 128, warm and cold+serial.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
timeout 150 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/ops.txt 2>&1; rc=$?
echo "ops rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]|Failure|Expected|Which is" $L/ops.txt | head -12 >> $S
if [ $rc -eq 0 ]; then
for m in 64 128; do
  timeout 100 $B/apps/fanout bench kernels --no-grouped --sweep --m $m --json $L/sweep_m$m.json > $L/sweep_m$m.txt 2>&1
  echo "== sweep $m rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E " $m " $L/sweep_m$m.txt | cut -c1-40,120-220 >> $S
done
timeout 100 $B/apps/fanout bench kernels --no-grouped --sweep --cold --serial --m 64 --json $L/sweep_m64_cold.json > $L/sweep_m64_cold.txt 2>&1
echo "== sweep 64 cold serial rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E " 64 " $L/sweep_m64_cold.txt | cut -c1-40,120-220 >> $S
fi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
