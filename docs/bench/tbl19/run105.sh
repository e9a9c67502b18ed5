#!/usr/bin/env bash
# NOT RUN: the device was withdrawn before this call (eighteenth session). For the next session:
# `git apply docs/bench/tbl19/per_warp_arrivals.patch`, build, put HEAD's fanout (per-thread
# arrivals) in the carry as build/fanout_hd beside the patched build, run this.
# One arrival per warp on the stage barriers (run104: q_b at M = 64 8.5-8.7 against 10.1-10.7 µs,
# everything else level). Every GPU suite on this build, then the
# M = 64 line three more times against the per-thread build (fanout_hd), and the dense table and
# the layer once each. Run from the repository root.
set -u
source scripts/device_env.sh
gpu_suites
for i in 1 2 3; do for v in new hd; do
  bin=$B/apps/fanout; [ $v = hd ] && bin=$B/fanout_hd
  m64_line "$v run $i" m64.$v.$i $bin
done; done
timeout 100 $B/apps/fanout bench kernels --no-grouped --json $L/dense.json > $L/dense.txt 2>&1
echo "dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.txt | tail -5 >> $S
timeout 100 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.json > $L/layer.txt 2>&1
echo "layer rc=$? $(grep -E '^layer total' $L/layer.txt | tr -s ' ' | tr '\n' ' ')" >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
