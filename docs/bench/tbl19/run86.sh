#!/usr/bin/env bash
# Seventeenth session, first call: (1) the review mend 0e82852 (`--data` through the bench's
# Context) with zeros, against run82; (2) the new read ceiling beside the M = 64 table; (3) is
# o_proj at M = 64 (82% of copy) held by W's 16 KB row pitch? The probe binary (fanout_probe:
# FANOUT_PROBE_W_PITCH sets W's tensor-map row pitch, the bench's W buffer has room) times the
# same GEMM on W rows 128 ... 4096 bytes further apart; (4) Nsight Compute's DRAM bytes per
# memory partition for o_proj and the dense gate+up at M = 64 (camping would show as uneven ones);
# (5) the review's fold of the 128 x 192 tile's K block into the shared promotion (only the two
# 128 x 192 kernels change): the GEMM tests, and qkv_a at M = 4096 beside the probe binary's
# (built before the fold) kernels. Run from the repository root: bash docs/bench/tbl19/run86.sh
set -u
source scripts/device_env.sh
P=.carry/probe/fanout_probe
timeout 200 $B/tests/ops/ops_cuda_test --gtest_filter='GemmFp8*:GroupedGemm*' > $L/ops_gemm.txt 2>&1
echo "ops_cuda gemm rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_gemm.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
for i in 1 2; do
  for bin in $B/apps/fanout $P; do
    echo "qkv_a 4096 $(basename $bin): $(timeout 60 $bin bench kernels --no-grouped --shape 'fused qkv_a' --m 4096 --json '' 2>&1 | grep -E '^fused qkv_a +4096 ')" >> $S
  done
done
timeout 150 $B/apps/fanout bench kernels --no-grouped --data zeros --json $L/zeros.json > $L/zeros.txt 2>&1
echo "zeros rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep -A6 "^sum over" $L/zeros.txt >> $S
for i in 1 2; do
  timeout 60 $B/apps/fanout bench kernels --no-grouped --m 64 --json $L/m64.$i.json > $L/m64.$i.txt 2>&1
  echo "m64.$i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  head -1 $L/m64.$i.txt >> $S; grep -E "^(o_proj|dense down|dense gate|shared gate|sum| +64 )" $L/m64.$i.txt >> $S
done
for r in 1 2; do
  for shape_k in "o_proj 16384" "dense down 18432" "shared gate+up 7168"; do
    shape=${shape_k% *}; k=${shape_k##* }
    for extra in none 0 128 256 1024 4096; do
      if [ $extra = none ]; then unset FANOUT_PROBE_W_PITCH; else export FANOUT_PROBE_W_PITCH=$((k + extra)); fi
      out=$(timeout 30 $P bench kernels --no-grouped --m 64 --shape "$shape" --json '' 2>&1 |
            awk -v s="$shape" 'index($0, s) == 1 && substr($0, length(s) + 1) ~ /^ +64 /')
      echo "probe r$r $shape pitch+$extra: $out" >> $S
    done
  done
done
unset FANOUT_PROBE_W_PITCH
for shape in o_proj "dense gate+up" "dense down"; do
  f=$(echo $shape | tr ' +' '__')
  timeout 120 ncu --kernel-name regex:gemm_fp8_sm90 --launch-skip 5 --launch-count 1 --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_read.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.max,dram__bytes_read.min,lts__t_sector_hit_rate.pct,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    --print-metric-instances values $B/apps/fanout bench kernels --no-grouped --m 64 --shape "$shape" --json '' > $L/ncu_$f.txt 2>&1
  echo "ncu $shape rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "gpu__time|dram__|lts__|sm__thr" $L/ncu_$f.txt | head -12 >> $S
done
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
