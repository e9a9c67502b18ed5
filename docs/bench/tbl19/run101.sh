#!/usr/bin/env bash
# Eighteenth session: run100's probe streamed W through cp.async ~5% faster than TMA past ~250 MB
# (dense gate+up 63.5-63.8 against 66.2-67.6 µs, 1 GiB 240-244 against 257-259). Here the GEMM
# with its single-CTA tiles' W through cp.async (producer warps 0, 2, 3), one binary,
# FANOUT_GEMM_W_CPASYNC=1 against 0, alternating: the GEMM and model tests on the cp.async path,
# then M = 64, the dense table, the grouped points and the layer. Run from the repository root.
# (The test loop: test_line of scripts/device_env.sh since the eighteenth session's review, the
# same commands it ran inline.)
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test; do FANOUT_GEMM_W_CPASYNC=1 test_line $t "(cp.async)"; done
for i in 1 2; do for v in 1 0; do FANOUT_GEMM_W_CPASYNC=$v m64_line "cp=$v run $i" m64.$v.$i $B/apps/fanout; done; done
for v in 1 0; do
  FANOUT_GEMM_W_CPASYNC=$v timeout 100 $B/apps/fanout bench kernels --no-grouped --json $L/dense.$v.json > $L/dense.$v.txt 2>&1
  echo "dense cp=$v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.$v.txt | tail -5 >> $S
done
for v in 1 0; do
  FANOUT_GEMM_W_CPASYNC=$v timeout 100 $B/apps/fanout bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped cp=$v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -hE "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt | sed 's/.*GEMMs/  GEMMs/' >> $S
done
for i in 1 2; do for v in 1 0; do
  FANOUT_GEMM_W_CPASYNC=$v timeout 100 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
  echo "layer cp=$v $i rc=$? $(grep -E '^layer total' $L/layer.$v.$i.txt | tr -s ' ' | tr '\n' ' ') grouped: $(grep -E '^grouped_(gate_up|down)' $L/layer.$v.$i.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
