#!/usr/bin/env bash
# Split-K's last CTA: other splits' partials loaded together, its own from registers. ops_cuda_test; M=64 warm and cold+serial, new vs head (alternating); layer b1,32.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in ops/ops_cuda_test model/model_cuda_test; do
  n=$(basename $t); timeout 100 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ')" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
i=0
for b in fanout fanout_pdl fanout fanout_pdl; do
  i=$((i+1))
  timeout 60 $B/apps/$b bench kernels --no-grouped --m 64 --json $L/kw_${i}_$b.json > $L/kw_${i}_$b.txt 2>&1
  echo "== warm $i $b rc=$?" >> $OUT/summary.txt; grep -E "^[a-z].* 64 " $L/kw_${i}_$b.txt | cut -c1-45 >> $OUT/summary.txt; grep -E "^ +64 " $L/kw_${i}_$b.txt >> $OUT/summary.txt
  timeout 60 $B/apps/$b bench kernels --no-grouped --m 64 --cold --serial --json $L/kc_${i}_$b.json > $L/kc_${i}_$b.txt 2>&1
  echo "== cold serial $i $b rc=$?" >> $OUT/summary.txt; grep -E "^ +64 " $L/kc_${i}_$b.txt >> $OUT/summary.txt
done
for b in fanout fanout_pdl; do
  i=$((i+1)); timeout 100 $B/apps/$b bench layer --batches 1,32 --eps 8 --replays 10 --json $L/layer_${i}_$b.json > $L/layer_${i}_$b.txt 2>&1
  echo "== layer $i $b rc=$?" >> $OUT/summary.txt; grep -E "^(qkv_a|o_proj|shared_gate_up|layer total)" $L/layer_${i}_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
