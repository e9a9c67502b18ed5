#!/usr/bin/env bash
# Idle warpgroups skip the MMA on 256-wide and 192-row tiles only: tests; grouped + dense + layer EP8, new vs gold.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in ops/ops_cuda_test model/model_cuda_test; do
  n=$(basename $t); timeout 150 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ')" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
for b in fanout fanout_gold; do
  timeout 100 $B/apps/$b bench kernels --no-dense --json $L/grouped_$b.json > $L/grouped_$b.txt 2>&1; echo "== grouped $b rc=$?" >> $OUT/summary.txt; grep -E "^EP.*(x|GEMMs)" $L/grouped_$b.txt | cut -c1-60 | head -15 >> $OUT/summary.txt
  timeout 60 $B/apps/$b bench kernels --no-grouped --json $L/dense_$b.json > $L/dense_$b.txt 2>&1
  echo "== dense $b rc=$?" >> $OUT/summary.txt; grep -E "^fused qkv_a +1024" $L/dense_$b.txt | cut -c1-45 >> $OUT/summary.txt; grep -A6 "^sum over" $L/dense_$b.txt >> $OUT/summary.txt
done
for b in fanout fanout_gold fanout fanout_gold; do
  timeout 40 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_$b.json > $L/layer_$b.txt 2>&1
  echo "== layer $b rc=$?" >> $OUT/summary.txt; grep -E "^(grouped_gate_up|grouped_down|layer total)" $L/layer_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
