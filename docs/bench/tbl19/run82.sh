#!/usr/bin/env bash
# The kernel bench's new per-row SM clock (NVML, sampled over each timing's replays): the dense
# shapes with the default data, then with zeros, then the default again.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
i=0
for data in uniform zeros uniform; do
  i=$((i+1))
  timeout 80 $B/apps/fanout bench kernels --no-grouped --data $data --json $L/dense_$data.$i.json > $L/dense_$data.$i.txt 2>&1
  echo "== $data rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  head -1 $L/dense_$data.$i.txt >> $S
  grep -E "^(o_proj|q_b|kv_b|fused).* (64|4096) " $L/dense_$data.$i.txt | cut -c1-40,100-200 >> $S
  grep -A6 "^sum over" $L/dense_$data.$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
