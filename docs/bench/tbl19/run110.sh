#!/usr/bin/env bash
# Nineteenth session. The build: the look-ahead on 64 × 64 tiles (run109), split K's last split
# reducing in place (no counter race: it waits for the others' count, adds their partials and its
# own registers), splits capped at one wave, and the dense MLP down projection at M <= 64 on the
# 64 × 64 / 2 tile (run109's sweep: 39.9 against 42.8-44.3 µs). build/fanout_la is run109's build
# (look-ahead only). Every GPU suite on the new build, the M = 64 line four times each way
# (alternating), the dense table once each way, the layer twice each way. From the repository root.
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
