#!/usr/bin/env bash
# Nineteenth session, on b718f08 (split K's last split reducing): the tile sweep at M = 128 and
# 256, where the table's split rows were chosen under the earlier split-K protocol. From the
# repository root.
set -u
source scripts/device_env.sh
for m in 128 256; do
  timeout 120 $B/apps/fanout bench kernels --no-grouped --m $m --sweep --json $L/sweep.$m.json > $L/sweep.$m.txt 2>&1
  echo "sweep $m rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A2 "^sum over" $L/sweep.$m.txt | tail -1 >> $S
  grep -E "^(fused|q_b|kv_b|o_proj|shared|dense)" $L/sweep.$m.txt | sed 's/^/  /' >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
