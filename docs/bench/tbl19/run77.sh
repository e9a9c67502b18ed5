#!/usr/bin/env bash
# S = HEAD (e34b2b4): the GPU suites not run on its kernel code, the microbatch and serve checks,
# the layer; dense sweeps at M = 1,024 / 4,096 for the table. D = S with dense 128 x 128 tiles in
# 2-CTA clusters deferring their epilogue (kDefer): its GEMM tests, sweeps and dense runs against S.
# (Ran as .carry/run77.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
gpu_suites ops/ops_D
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
