#!/usr/bin/env bash
# Nsight Compute (--set full, details page) on two tile kernels of the final code: the masked
# 128 x 128 kernel at the EP64 decode point (gate+up, 4 experts x ~530 tokens: the first launch of
# the default after the EP8-EP32 points' 824 launches of that kernel), and the dense 128 x 256 pair
# kernel on q_b at M = 4096. Question: is the grouped kernel L2-bound where the dense one is not?
# (Ran as .carry/run83.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
timeout 200 ncu --kernel-name-base demangled --kernel-name "regex:kernel<128, 128, 6, [^,]*2, 1>" --launch-skip 824 --launch-count 1 \
  --set full -o $OUT/masked $B/apps/fanout bench kernels --no-dense --json '' > $OUT/ncu_masked.txt 2>&1
echo "ncu masked rc=$? t=$(( $(date +%s) - t0 ))" >> $S
timeout 120 ncu --kernel-name regex:gemm_fp8_sm90_kernel --launch-skip 3 --launch-count 1 --set full \
  -o $OUT/dense $B/apps/fanout bench kernels --no-grouped --shape q_b --m 4096 --config 128x256/1c2 --json '' > $OUT/ncu_dense.txt 2>&1
echo "ncu dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S
for r in masked dense; do
  ncu --import $OUT/$r.ncu-rep --page details --csv > $OUT/${r}_details.csv 2> $OUT/${r}_details.err; echo "details $r rc=$?" >> $S
done
gzip -9 $OUT/*.csv
rm -f $OUT/*.ncu-rep
tail -5 $OUT/ncu_masked.txt >> $S
cat $S
