#!/usr/bin/env bash
# NOT RUN YET (written in the twentieth session, which was lent no device). The first one-GPU call
# of the next session. Carry: HEAD's build as usual (scripts/prepare_carry.sh, /tmp/pack.sh), plus
# build/fanout_910 = 910fd6e's fanout (the last build measured on a GPU's GEMM launch path) and
# build/fanout_tbl = HEAD with docs/bench/tbl19/table_m128_m256.patch applied (q_b at M 65-128 on
# 128 × 192 split 2, the shared gate+up at M 129-256 on 128 × 128 split 2, both instead of
# cuBLASLt). Checks, in order:
#  1. every GPU suite on HEAD (the twentieth session's changes ran on no GPU: the launch's one tile
#     list, the split-K capacities in Operands, the side context without MLA scratch, the new test
#     GemmFp8Cuda.UnbuiltTileIsAnError; and 910fd6e's exec_mb without a side context);
#  2. the M = 64 line, HEAD against 910fd6e (the launch refactor must not move it);
#  3. the MoE layer with its side stream (HEAD), the figure item 5 is judged by;
#  4. the table patch: M = 128 and 256, patched against HEAD, three times each way.
set -u
source scripts/device_env.sh
gpu_suites
m64_ab 2 $B/apps/fanout $B/fanout_910
run_line "layer HEAD" layer $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.json
for i in 1 2 3; do for v in tbl head; do
  bin=$B/apps/fanout; [ $v = tbl ] && bin=$B/fanout_tbl
  for m in 128 256; do
    timeout 30 $bin bench kernels --no-grouped --m $m --json $L/m$m.$v.$i.json > $L/m$m.$v.$i.txt 2>&1
    echo "m$m $v $i: $(grep -A1 '^sum over' $L/m$m.$v.$i.txt | tail -1) | $(grep -E '^(q_b|shared gate)' $L/m$m.$v.$i.txt | awk '{print $1,$2,$4,$5,$6}' | tr '\n' ';')" >> $S
  done
done; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
