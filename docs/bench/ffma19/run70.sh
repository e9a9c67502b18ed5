#!/usr/bin/env bash
# FFMA experiment: G = HEAD, S = split-K quads stored pair-swapped (acc off the fragment's register
# parity), SY = S with every promotion FFMA yielding and no operand reuse, SN = S with no FFMA yielding.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
for v in S SY SN; do
  timeout 120 $B/tests/ops/ops_$v --gtest_filter='GemmFp8Cuda.*:GroupedGemmFp8Cuda.*' > $L/tests_$v.txt 2>&1
  echo "tests $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests_$v.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
done
for v in G S SY SN G SY; do
  timeout 70 $B/apps/fanout_$v bench kernels --no-grouped --json $L/dense_$v.$(date +%s).json > $L/dense_$v.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.txt >> $S
  grep -E " (1024|4096) " $L/dense_$v.txt | cut -c1-60 >> $S
  cp $L/dense_$v.txt $L/dense_$v.$(date +%s).txt
done
for v in G SY G SY; do
  timeout 60 $B/apps/fanout_$v bench kernels --no-dense --json $L/grouped_$v.$(date +%s).json > $L/grouped_$v.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -iE "sum|EP" $L/grouped_$v.txt | head -20 >> $S
  cp $L/grouped_$v.txt $L/grouped_$v.$(date +%s).txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
