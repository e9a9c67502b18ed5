#!/usr/bin/env bash
# Twenty-sixth session, the final code: run131's kernel plus the discard of the split partials' L2
# lines and the default's one-wave rule (pick_grouped_masked_config). GEMM, model, engine and EP
# suites; the grouped points, head (41a7a34, packed as an extra: scripts/pack_carry.sh build
# /tmp/fanout_head) then new; the layer at EP8..EP128 (batches 32 and 128), new and head alternating.
# (The discard was withdrawn after this run: the down projection after a split gate+up read the
# same 1-3 µs slower with and without it.)
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do test_line $t; done
run_line "grouped head" grouped.head $B/fanout_head bench kernels --no-dense --json $L/grouped.head.json
run_line "grouped new" grouped.new $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.json
for i in 1 2; do
  for v in new head; do
    bin=$B/apps/fanout; [ $v = head ] && bin=$B/fanout_head
    timeout 120 $bin bench layer --batches 32,128 --eps 8,16,32,64,128 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v $i rc=$? t=$(( $(date +%s) - t0 )): $(grep -E '^EP8, batch 128' $L/layer.$v.$i.txt)" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
