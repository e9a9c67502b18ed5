#!/usr/bin/env bash
# Nineteenth session. The build: run110's with the last split adding the others' partials to its
# own registers a split at a time (run110 loaded them a float4 at a time across the splits: the
# 4-way splits lost 2-3 µs) and the split-K workspace checked after the launch caps the splits.
# build/fanout_la is run109's build (the look-ahead only). Every GPU suite on the new build, the
# M = 64 line four times each way (alternating), the dense table once each way, the layer twice
# each way. From the repository root.
set -u
source scripts/device_env.sh
gpu_suites
for i in 1 2 3 4; do for v in new la; do
  bin=$B/apps/fanout; [ $v = la ] && bin=$B/fanout_la
  m64_line "$v run $i" m64.$v.$i $bin
done; done
for v in new la; do
  bin=$B/apps/fanout; [ $v = la ] && bin=$B/fanout_la
  timeout 100 $bin bench kernels --no-grouped --json $L/dense.$v.json > $L/dense.$v.txt 2>&1
  echo "dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.$v.txt | tail -5 >> $S
done
for i in 1 2; do for v in new la; do
  bin=$B/apps/fanout; [ $v = la ] && bin=$B/fanout_la
  timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
  echo "layer $v $i rc=$? $(grep -E '^layer total' $L/layer.$v.$i.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
