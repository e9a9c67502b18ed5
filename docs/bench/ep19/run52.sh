#!/usr/bin/env bash
# The nvlink combine's reduce: grid-stride over tokens (A, the commit) against a block per token (B): ep_gpu_test of B, bench comm A/B alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
B=.carry/build
L=$OUT/logs; mkdir -p $L
timeout 120 $B/tests/comm/ep_gpu_test_b > $L/ep_gpu_test_b.txt 2>&1; echo "ep_gpu_test_b rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ep_gpu_test_b.txt | tr '\n' ' ')" >> $OUT/summary.txt
for b in fanout fanout_b fanout fanout_b; do
  timeout 100 $B/apps/$b bench comm --backends nvlink --tokens 1,8,128,512 --json $L/comm_$b.json > $L/comm_$b.txt 2>&1
  echo "== comm $b rc=$?" >> $OUT/summary.txt; grep -E "^(nvlink|nccl) " $L/comm_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
