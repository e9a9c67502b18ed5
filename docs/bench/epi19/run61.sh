#!/usr/bin/env bash
# GEMM epilogue per warp (e0: one block per warpgroup; e1: two where no stage is lost; e2: the
# whole tile, fewer stages) against gold (HEAD): GEMM tests, dense and grouped benches.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
for e in e0 e1 e2; do
  timeout 120 $B/tests/ops/ops_cuda_test_$e --gtest_filter='*Gemm*:*SiluMul*' > $L/ops_$e.txt 2>&1; rc=$?
  echo "ops_$e rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_$e.txt | tr '\n' ' ')" >> $S
  grep -E "^\[  FAILED  \]" $L/ops_$e.txt | head -5 >> $S
done
t0=$(date +%s)
for b in fanout_gold fanout_e2 fanout_e0 fanout_gold fanout_e2; do
  timeout 90 $B/apps/$b bench kernels --no-grouped --json $L/dense_$b.json > $L/dense_$b.txt 2>&1
  echo "== dense $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^[a-z].* (1024|4096) " $L/dense_$b.txt >> $S; grep -A6 "^sum over" $L/dense_$b.txt >> $S
done
for b in fanout_gold fanout_e2 fanout_e0 fanout_e1; do
  timeout 100 $B/apps/$b bench kernels --no-dense --json $L/grouped_$b.json > $L/grouped_$b.txt 2>&1; echo "== grouped $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^EP" $L/grouped_$b.txt | cut -c1-60,110-160 >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
