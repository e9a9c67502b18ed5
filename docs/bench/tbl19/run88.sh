#!/usr/bin/env bash
# Is the decode GEMMs' memory rate held by W's access pattern in DRAM? Probe build: with
# FANOUT_PROBE_W_TILED set, the dense 64 x 64 tiles (CL = 1) load each W box as 8 KB contiguous
# bytes (W viewed as [N*K/128, 128], box (n0/64 * nkb + kb) * 64): the same bytes per stage and
# the same kernel, the results garbage, the DRAM pattern sequential. M = 64, alternating, and
# Nsight Compute's DRAM rate for o_proj both ways. Run from the repository root.
# (The M = 64 line: m64_line of scripts/device_env.sh since the seventeenth session's review, the
# same commands this script ran inline.)
set -u
source scripts/device_env.sh
for i in 1 2 3; do
  for v in rowmajor tiled; do
    if [ $v = tiled ]; then export FANOUT_PROBE_W_TILED=1; else unset FANOUT_PROBE_W_TILED; fi
    m64_line "$v run $i" m64.$v.$i $B/apps/fanout
  done
done
for v in rowmajor tiled; do
  if [ $v = tiled ]; then export FANOUT_PROBE_W_TILED=1; else unset FANOUT_PROBE_W_TILED; fi
  timeout 120 ncu --kernel-name regex:gemm_fp8_sm90 --launch-skip 5 --launch-count 1 --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_read.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct \
    $B/apps/fanout bench kernels --no-grouped --m 64 --shape o_proj --json '' > $L/ncu_oproj_$v.txt 2>&1
  echo "ncu o_proj $v rc=$?" >> $S
  grep -E "gpu__time|dram__|lts__" $L/ncu_oproj_$v.txt | head -6 >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
