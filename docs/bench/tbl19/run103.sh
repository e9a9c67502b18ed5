#!/usr/bin/env bash
# Eighteenth session: the decode GEMM's time against K (W [7168, K], M = 64, 64 x 64 tiles split 1
# and 2, W rotated over copies) beside read16 and the bare TMA stream of the same bytes, twice:
# the intercept is what a launch costs besides its bytes, the slope its rate.
# Run from the repository root.
set -u
source scripts/device_env.sh
for i in 1 2; do
  timeout 120 $B/tma_read_probe_k kscan > $L/kscan.$i.txt 2>&1
  echo "kscan $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S; cat $L/kscan.$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
