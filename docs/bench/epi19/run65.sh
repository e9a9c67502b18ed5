#!/usr/bin/env bash
# Masked grouped GEMM: 128 x 256 tiles for the down projection (K <= 2048) up to 512 tokens per
# expert, against c231ca8 (fanout_base: 128 x 128 past 128 tokens): bench kernels --no-dense and
# bench layer at EP32 / EP64, alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
i=0
for b in fanout fanout_base fanout fanout_base; do
  i=$((i+1))
  timeout 60 $B/apps/$b bench kernels --no-dense --json $L/grouped_${b}_$i.json > $L/grouped_${b}_$i.txt 2>&1
  echo "== grouped $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^EP[0-9]+ +7168x2048 +[0-9]+ +[0-9]+ |GEMMs" $L/grouped_${b}_$i.txt | cut -c1-60,100-200 >> $S
done
for b in fanout fanout_base fanout fanout_base; do
  i=$((i+1))
  timeout 60 $B/apps/$b bench layer --batches 128 --eps 32,64 --replays 10 --json $L/layer_${b}_$i.json > $L/layer_${b}_$i.txt 2>&1
  echo "== layer $b rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(grouped_down|grouped_gate_up|layer total|MoE)" $L/layer_${b}_$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
