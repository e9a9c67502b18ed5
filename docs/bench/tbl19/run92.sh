#!/usr/bin/env bash
# The session's final code: item 1's dense table (default data) twice and the layer
# (`--batches 32,128 --eps 8 --replays 10`) twice, for the closing figures. Run from the repository root.
set -u
source scripts/device_env.sh
for i in 1 2; do
  timeout 150 $B/apps/fanout bench kernels --no-grouped --json $L/dense.$i.json > $L/dense.$i.txt 2>&1
  echo "dense $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  head -1 $L/dense.$i.txt >> $S; grep -A6 "^sum over" $L/dense.$i.txt >> $S
done
for i in 1 2; do
  timeout 150 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$i.json > $L/layer.$i.txt 2>&1
  echo "layer $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^(dense layer|MoE layer|attention|layer total)" $L/layer.$i.txt | sed 's/^/  /' >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
