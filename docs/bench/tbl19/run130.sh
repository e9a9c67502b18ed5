#!/usr/bin/env bash
# Twenty-sixth session, second call: the masked last-wave split K as it landed (splits of at least
# 16 K blocks; the default splits the gate+up at EP32/EP64 on 128 × 256 tiles, nothing else).
# New build's GEMM suite, then the grouped points and the layer at EP8..EP128 (batch 128), new and
# head (41a7a34, packed as an extra: scripts/pack_carry.sh build /tmp/fanout_head) alternating.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
for i in 1 2; do
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
  run_line "grouped head $i" grouped.head.$i $B/fanout_head bench kernels --no-dense --json $L/grouped.head.$i.json
done
for i in 1 2 3; do
  for v in new head; do
    bin=$B/apps/fanout; [ $v = head ] && bin=$B/fanout_head
    timeout 120 $bin bench layer --batches 128 --eps 8,16,32,64,128 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S | grep -v "^ \|^EP\|^grouped contig\|^$\|^NVIDIA\|^wrote"
