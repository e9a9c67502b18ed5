#!/usr/bin/env bash
# The scale loader with its loads in flight ahead (64-row tiles: the next 4 K blocks' sx and sw
# loaded while it waits for a stage; taller tiles 1), against the session's previous final build
# (fanout_old), alternating: the GEMM, model and engine tests first, then M = 64 twice, the dense
# table, the grouped points and the layer. run94/run95 found o_proj at M = 64 unchanged by more
# ring stages or no x at all, which leaves the loader's serial chain of L2 misses.
# Run from the repository root.
# (The M = 64 line: m64_line of scripts/device_env.sh since the seventeenth session's review, the
# same commands this script ran inline.)
set -u
source scripts/device_env.sh
tar xJf .carry/stages.tar.xz -C .carry
OLD=.carry/stages/fanout_old
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
for i in 1 2; do
  for v in new old; do
    bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
    m64_line "$v run $i" m64.$v.$i $bin
  done
done
for v in new old; do
  bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
  timeout 100 $bin bench kernels --no-grouped --json $L/dense.$v.json > $L/dense.$v.txt 2>&1
  echo "dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.$v.txt | tail -5 >> $S
done
for v in new old; do
  bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
  timeout 100 $bin bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -hE "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt | sed 's/.*GEMMs/  GEMMs/' >> $S
done
for v in new old; do
  bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
  timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.json > $L/layer.$v.txt 2>&1
  echo "layer $v rc=$?" >> $S; grep -E "^(dense layer|MoE layer|layer total)" $L/layer.$v.txt | sed 's/^/  /' >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
