#!/usr/bin/env bash
# For the next session: Nsight Compute's full set on the decode GEMM furthest from the read
# ceiling — o_proj at M = 64 (64 x 64 tiles, split 2; 37 us against 26 us of W at 4,480 GB/s) —
# and, as the comparison, the dense gate+up at M = 64 (64 x 64, no split; 80% of the read ceiling).
# Clock and caches as the bench leaves them. Run from the repository root.
set -u
source scripts/device_env.sh
for shape in o_proj "dense gate+up"; do
  f=$(echo $shape | tr ' +' '__')
  timeout 200 ncu --kernel-name regex:gemm_fp8_sm90 --launch-skip 5 --launch-count 1 --clock-control none --cache-control none \
    --set full -o $OUT/$f $B/apps/fanout bench kernels --no-grouped --m 64 --shape "$shape" --json '' > $L/ncu_$f.txt 2>&1
  echo "ncu $shape rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  ncu --import $OUT/$f.ncu-rep --page details --csv > $OUT/${f}_details.csv 2> $L/${f}_details.err
  ncu --import $OUT/$f.ncu-rep --page raw --csv > $OUT/${f}_raw.csv 2>> $L/${f}_details.err
  echo "details $shape rc=$?" >> $S
done
gzip -9 $OUT/*.csv
rm -f $OUT/*.ncu-rep
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
