#!/usr/bin/env bash
# Per-warp TMA-store epilogue (final form): every GPU test; layer A/B against gold (HEAD);
# dense + grouped benches once; an ncu profile of the batch-128 layer's kernels.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
for t in ops/ops_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/glue_cuda_test ops/pdl_cuda_test engine/engine_cuda_test comm/ep_gpu_test model/model_cuda_test; do
  n=$(basename $t); timeout 90 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ')" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
echo "tests t=$(( $(date +%s) - t0 ))" >> $S
for b in fanout fanout_gold fanout fanout_gold; do
  timeout 45 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_$b.json > $L/layer_$b.txt 2>&1
  echo "== layer $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(o_proj|shared_gate_up|shared_down|grouped_gate_up|grouped_down|layer total)" $L/layer_$b.txt >> $S
done
timeout 60 $B/apps/fanout bench kernels --no-grouped --json $L/dense_fanout.json > $L/dense_fanout.txt 2>&1
echo "== dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_fanout.txt >> $S
timeout 80 $B/apps/fanout bench kernels --no-dense --json $L/grouped_fanout.json > $L/grouped_fanout.txt 2>&1
echo "== grouped rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "GEMMs" $L/grouped_fanout.txt >> $S
OUT=$L BATCHES=128 timeout 150 bash scripts/gpu_tail_profile.sh $B > $L/tail_b128.txt 2>&1
echo "== tail rc=$? t=$(( $(date +%s) - t0 ))" >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
