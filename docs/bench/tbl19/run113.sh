#!/usr/bin/env bash
# NOT RUN (the session's device time ran out). Apply docs/bench/tbl19/table_m128_m256.patch to
# b718f08 or later, build, carry the unpatched fanout as build/fanout_b7.
# Nineteenth session. The build: b718f08 with run112's sweep in the table (q_b at M 65-128 on
# 128 × 192 split 2 instead of cuBLASLt; the shared gate+up at M 129-256 on 128 × 128 split 2
# instead of cuBLASLt); build/fanout_b7 is b718f08's fanout. The GEMM, model and engine suites,
# then the M = 128 and 256 lines three times each way (alternating). From the repository root.
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test; do test_line $t; done
for i in 1 2 3; do for v in new b7; do
  bin=$B/apps/fanout; [ $v = b7 ] && bin=$B/fanout_b7
  for m in 128 256; do
    timeout 30 $bin bench kernels --no-grouped --m $m --json $L/m$m.$v.$i.json > $L/m$m.$v.$i.txt 2>&1
    echo "m$m $v $i: $(grep -A1 '^sum over' $L/m$m.$v.$i.txt | tail -1) | $(grep -E '^(q_b|shared gate)' $L/m$m.$v.$i.txt | awk '{print $1,$2,$4,$5,$6}' | tr '\n' ';')" >> $S
  done
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
