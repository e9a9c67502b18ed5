#!/usr/bin/env bash
# Final binaries (db930ae): every GPU test.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
for t in comm/ep_gpu_test engine/engine_cuda_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test ops/ops_cuda_test model/model_cuda_test; do
  n=$(basename $t); timeout 60 $B/tests/$t > $OUT/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $OUT/$n.txt | tr '\n' ' ')" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $OUT/$n.txt | head -5 >> $OUT/summary.txt
done
cat $OUT/summary.txt
