#!/usr/bin/env bash
# the last row block's x box as tall as its rows (trimmed): GEMM-using GPU tests; bench M=66/100/200 tail vs base; layer b1,50.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test; do
  n=$(basename $t); timeout 100 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ')" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
for m in 66 100 200; do
  for b in fanout fanout_base; do
    timeout 40 $B/apps/$b bench kernels --cold --serial --no-grouped --m $m --json $L/k_${b}_m$m.json > $L/k_${b}_m$m.txt 2>&1
    echo "== $b m$m rc=$?" >> $OUT/summary.txt; grep -E "^[a-z].* $m " $L/k_${b}_m$m.txt | cut -c1-60 >> $OUT/summary.txt
  done
done
i=0
for b in fanout fanout_base; do
  i=$((i+1)); timeout 60 $B/apps/$b bench layer --batches 1,50 --eps 8 --replays 10 --json $L/layer_${i}_$b.json > $L/layer_${i}_$b.txt 2>&1
  echo "== layer $i $b rc=$?" >> $OUT/summary.txt; grep -E "^(qkv_a|q_b|kv_b|o_proj|shared_gate_up|shared_down|layer total)" $L/layer_${i}_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
