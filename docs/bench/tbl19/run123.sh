#!/usr/bin/env bash
# Twenty-fifth session: the 256-wide tiles' two halves with A from registers (ldmatrix once per K
# block, wgmma RS) against head (fanout_head, a4ca88a's code). The ops suite (every tile against
# the CPU reference), then alternating `bench kernels --no-grouped` at M = 1024 and 4096, then the
# grouped points (EP8/EP16 run 256-wide tiles) of each.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
test_line ops/glue_cuda_test
kernels_ab 2 1024 $B/apps/fanout $B/fanout_head
kernels_ab 2 4096 $B/apps/fanout $B/fanout_head
kernels_line "new" m256.new $B/apps/fanout 256
kernels_line "old" m256.old $B/fanout_head 256
for i in 1 2; do
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
  run_line "grouped old $i" grouped.old.$i $B/fanout_head bench kernels --no-dense --json $L/grouped.old.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
