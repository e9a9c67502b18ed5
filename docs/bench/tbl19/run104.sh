#!/usr/bin/env bash
# Eighteenth session: run103 put the M = 64 GEMM's rate 12% under the bare TMA stream's (slope over
# K). Here one arrival per warp on the stage barriers (lane 0 after __syncwarp: the scale loader on
# `full`, each consumer warp on `empty`) instead of one per thread, against the same code with
# per-thread arrivals (fanout_hd, probe_k_hd), alternating: the GEMM and model tests, the K scan,
# M = 64, the grouped points and the layer. Run from the repository root.
# (The test loop: test_line of scripts/device_env.sh since the eighteenth session's review, the
# same commands it ran inline.)
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test; do test_line $t; done
for i in 1 2; do
  for v in new hd; do
    timeout 120 $B/probe_k_$v kscan > $L/kscan.$v.$i.txt 2>&1
    echo "kscan $v $i rc=$?" >> $S; grep "^K " $L/kscan.$v.$i.txt >> $S
  done
done
for i in 1 2; do for v in new hd; do
  bin=$B/apps/fanout; [ $v = hd ] && bin=$B/fanout_hd
  m64_line "$v run $i" m64.$v.$i $bin
done; done
for v in new hd; do
  bin=$B/apps/fanout; [ $v = hd ] && bin=$B/fanout_hd
  timeout 100 $bin bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -hE "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt | sed 's/.*GEMMs/  GEMMs/' >> $S
done
for v in new hd; do
  bin=$B/apps/fanout; [ $v = hd ] && bin=$B/fanout_hd
  timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.json > $L/layer.$v.txt 2>&1
  echo "layer $v rc=$? $(grep -E '^layer total' $L/layer.$v.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
