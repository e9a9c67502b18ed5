#!/usr/bin/env bash
# Nineteenth session. The build: e79d4b6 plus the scale loader's four-K-block look-ahead on the
# 64 × 64 tiles only (run108 had it on every 64-row tile; q_b's 64 × 128 lost 1-3 µs);
# build/fanout_pw is e79d4b6's fanout. The GEMM suite, the M = 64 line four times each way
# (alternating), then the tile sweep at M = 64 on the new build. Run from the repository root.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
for i in 1 2 3 4; do for v in new pw; do
  bin=$B/apps/fanout; [ $v = pw ] && bin=$B/fanout_pw
  m64_line "$v run $i" m64.$v.$i $bin
done; done
timeout 200 $B/apps/fanout bench kernels --no-grouped --m 64 --sweep --json $L/sweep.json > $L/sweep.txt 2>&1
echo "sweep rc=$? t=$(( $(date +%s) - t0 ))" >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
