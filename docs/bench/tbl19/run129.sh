#!/usr/bin/env bash
# Twenty-sixth session: the masked grouped GEMM's split K of a last, partial wave (gemm_fp8_sm90.cu).
# New build's GEMM, model, engine and EP suites (the new MaskedSplitsTheLastWaveInK; the layer now
# hands its workspace to the expert GEMMs), then its grouped points twice (the variants /8 are
# the tail split), then the layer at EP8..EP128, batch 128, new and head (41a7a34, packed as an
# extra: scripts/pack_carry.sh build /tmp/fanout_head) alternating.
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do test_line $t; done
for i in 1 2; do
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
done
for i in 1 2; do
  for v in new head; do
    bin=$B/apps/fanout; [ $v = head ] && bin=$B/fanout_head
    timeout 120 $bin bench layer --batches 128 --eps 8,16,32,64,128 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v $i rc=$? t=$(( $(date +%s) - t0 )): $(grep -E '^EP[0-9]+, batch' $L/layer.$v.$i.txt | sed -E 's/, query 2, KV 5000 \(no communication\)//; s/ \(target.*grouped GEMM/ grouped/; s/ \(target.*//' | tr '\n' ';')" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
