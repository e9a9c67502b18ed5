#!/usr/bin/env bash
# Nineteenth session. The build: e79d4b6 (one arrival per warp) plus the scale loader with the next
# four K blocks' loads in flight on 64-row tiles (scale_loader_ahead.patch ported to per-warp
# arrivals); build/fanout_pw is e79d4b6's fanout; build/chain_probe the consumer-chain probe with
# K 8192 added (slopes) and the faulting 4-consumer variant dropped.
# GEMM-level suites on the new build, the M = 64 line four times each way (alternating), the dense
# and grouped tables and the layer once each way, the probe once. Run from the repository root.
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test; do test_line $t; done
for i in 1 2 3 4; do for v in new pw; do
  bin=$B/apps/fanout; [ $v = pw ] && bin=$B/fanout_pw
  m64_line "$v run $i" m64.$v.$i $bin
done; done
for v in new pw; do
  bin=$B/apps/fanout; [ $v = pw ] && bin=$B/fanout_pw
  timeout 100 $bin bench kernels --no-grouped --json $L/dense.$v.json > $L/dense.$v.txt 2>&1
  echo "dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.$v.txt | tail -5 >> $S
  timeout 100 $bin bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt | sed 's/^/  /' >> $S
  timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.json > $L/layer.$v.txt 2>&1
  echo "layer $v rc=$? $(grep -E '^layer total' $L/layer.$v.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done
run_line "chain_probe" chain $B/chain_probe
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
