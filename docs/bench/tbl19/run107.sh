#!/usr/bin/env bash
# Nineteenth session: run105 and run106 in one call. The build is HEAD plus
# docs/bench/tbl19/per_warp_arrivals.patch (one mbarrier arrival per warp on the stage barriers);
# build/fanout_hd is HEAD's fanout (per-thread arrivals); build/chain_probe is chain_probe.cu.
# Every GPU suite on the patched build, the M = 64 line three times each way, the dense table and
# the layer once, then the consumer-chain probe twice. Run from the repository root.
set -u
source scripts/device_env.sh
gpu_suites
for i in 1 2 3; do for v in new hd; do
  bin=$B/apps/fanout; [ $v = hd ] && bin=$B/fanout_hd
  m64_line "$v run $i" m64.$v.$i $bin
done; done
timeout 100 $B/apps/fanout bench kernels --no-grouped --json $L/dense.json > $L/dense.txt 2>&1
echo "dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.txt | tail -5 >> $S
timeout 100 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.json > $L/layer.txt 2>&1
echo "layer rc=$? $(grep -E '^layer total' $L/layer.txt | tr -s ' ' | tr '\n' ' ')" >> $S
for i in 1 2; do run_line "chain_probe $i" chain.$i $B/chain_probe; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
