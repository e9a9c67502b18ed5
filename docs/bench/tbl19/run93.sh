#!/usr/bin/env bash
# Which L2 sub-unit reads 74% in the decode GEMMs (run91)? Nsight Compute's breakdown of
# lts__throughput for o_proj at M = 64, the masked EP8 gate+up, and the read ceiling's own kernel
# (read16) for reference. Run from the repository root.
set -u
source scripts/device_env.sh
M=breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,breakdown:dram__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum,dram__bytes_read.sum.per_second
timeout 120 ncu --kernel-name regex:gemm_fp8_sm90 --launch-skip 5 --launch-count 1 --clock-control none --cache-control none --metrics $M \
  $B/apps/fanout bench kernels --no-grouped --m 64 --shape o_proj --json '' > $L/ncu_oproj.txt 2>&1; echo "o_proj rc=$?" >> $S
timeout 120 ncu --kernel-name regex:read16 --launch-skip 2 --launch-count 1 --clock-control none --cache-control none --metrics $M \
  $B/apps/fanout bench kernels --no-grouped --m 64 --shape o_proj --json '' > $L/ncu_read16.txt 2>&1; echo "read16 rc=$?" >> $S
timeout 150 ncu --kernel-name regex:gemm_fp8_sm90 --launch-skip 3 --launch-count 1 --clock-control none --cache-control none --metrics $M \
  $B/apps/fanout bench kernels --no-dense --json '' > $L/ncu_masked_ep8.txt 2>&1; echo "masked EP8 rc=$?" >> $S
for f in oproj read16 masked_ep8; do
  echo "== $f" >> $S; grep -E "^ +(lts|dram|gpu|fbpa|ltc)" $L/ncu_$f.txt | sort -k3 -n -r | head -30 >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
