#!/usr/bin/env bash
# Twenty-sixth session, the final code (the masked last-wave split K in its own instantiation,
# unpaired CTAs only): every GPU suite; item 1's and item 2's tables (`bench kernels`); `bench mla`
# at batch 128 (head-major); then the grouped points and the layer at EP8..EP128 (batch 128, plus
# batch 32 at EP8), new and head (41a7a34, packed as an extra: scripts/pack_carry.sh build
# /tmp/fanout_head) alternating.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
run_line "mla b128 head-major" mla.hm $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.json
for i in 1 2; do
  run_line "grouped head $i" grouped.head.$i $B/fanout_head bench kernels --no-dense --json $L/grouped.head.$i.json
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
done
for i in 1 2 3; do
  for v in new head; do
    bin=$B/apps/fanout; [ $v = head ] && bin=$B/fanout_head
    timeout 120 $bin bench layer --batches 32,128 --eps 8,16,32,64,128 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v $i rc=$? t=$(( $(date +%s) - t0 )): $(grep -E '^EP8, batch 128' $L/layer.$v.$i.txt)" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
