#!/usr/bin/env bash
# Eighteenth session: the MoE layer's shared expert on a side stream beside the router GEMM,
# top-k and dispatch send. One binary, FANOUT_SHARED_JOIN picks where the stream joins back
# (off: one stream, as before; experts: before the grouped GEMMs; combine: before the combine),
# alternating; then the GPU suites on it. Run from the repository root.
set -u
source scripts/device_env.sh
for i in 1 2; do
  for j in off experts combine; do
    FANOUT_SHARED_JOIN=$j timeout 100 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$j.$i.json > $L/layer.$j.$i.txt 2>&1
    echo "layer $j $i rc=$? $(grep -E '^layer total' $L/layer.$j.$i.txt | tr -s ' ')" >> $S
  done
done
gpu_suites
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
