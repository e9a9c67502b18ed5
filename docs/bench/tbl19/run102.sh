#!/usr/bin/env bash
# Eighteenth session, final commit: every GPU suite; the layer with the shared expert on the side
# stream (this build) against the previous session's final build (fanout_old, one stream),
# alternating; the M = 64 line twice, the dense table and the grouped points once.
# Run from the repository root.
set -u
source scripts/device_env.sh
OLD=$B/fanout_old
gpu_suites
for i in 1 2 3; do
  for v in new old; do
    bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
    timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v $i rc=$? $(grep -E '^layer total' $L/layer.$v.$i.txt | tr -s ' ' | tr '\n' ' ')" >> $S
  done
done
for i in 1 2; do m64_line "run $i" m64.$i $B/apps/fanout; done
timeout 100 $B/apps/fanout bench kernels --no-grouped --json $L/dense.json > $L/dense.txt 2>&1
echo "dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.txt | tail -5 >> $S
timeout 100 $B/apps/fanout bench kernels --no-dense --json $L/grouped.json > $L/grouped.txt 2>&1
echo "grouped rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -hE "GEMMs .* vs DeepGEMM" $L/grouped.txt | sed 's/.*GEMMs/  GEMMs/' >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
