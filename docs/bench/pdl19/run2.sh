#!/usr/bin/env bash
# PDL on the MLA kernel: bench mla new vs tail; bench layer new / nomla (MLA launched without PDL) / tail, alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build
L=$OUT/logs; mkdir -p $L
i=0
for b in fanout fanout_tail fanout fanout_tail; do
  i=$((i+1)); timeout 60 $B/apps/$b bench mla --batches 1,32,128 --prefill '' --json $L/mla_${i}_$b.json > $L/mla_${i}_$b.txt 2>&1
  echo "== mla $i $b rc=$?" >> $OUT/summary.txt; grep -E "^ +(1|32|128) +2 " $L/mla_${i}_$b.txt | head -6 >> $OUT/summary.txt
done
for b in fanout fanout_nomla fanout_tail fanout fanout_nomla fanout_tail; do
  i=$((i+1)); timeout 100 $B/apps/$b bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer_${i}_$b.json > $L/layer_${i}_$b.txt 2>&1
  echo "== layer $i $b rc=$?" >> $OUT/summary.txt; grep -E "^(attention|layer total)" $L/layer_${i}_$b.txt >> $OUT/summary.txt
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
