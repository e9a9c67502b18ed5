#!/usr/bin/env bash
# Ran in the twenty-first session (run115_summary.txt). The first one-GPU call
# of the next session. Carry: HEAD's build as usual (scripts/prepare_carry.sh, /tmp/pack.sh), plus
# build/fanout_b7 = b718f08's fanout (/tmp/fanout_b7 if this machine kept it; its GEMM code is
# run111's, the last measured) and build/fanout_tbl = HEAD with docs/bench/tbl19/table_m128_m256.patch applied (q_b at M 65-128 on
# 128 × 192 split 2, the shared gate+up at M 129-256 on 128 × 128 split 2, both instead of
# cuBLASLt). Checks, in order:
#  1. every GPU suite on HEAD (the twentieth session's changes ran on no GPU: the launch's one tile
#     list and configuration check, the split-K capacities in Operands, the side context without
#     MLA scratch, per-device kernel attributes (PerDevice), GemmWorkspace's waited memset; new
#     tests GemmFp8Cuda.UnbuiltTileIsAnError, GemmFp8Cuda.EveryDeviceOfOneProcess,
#     MlaCuda.EveryDeviceOfOneProcess; and 910fd6e's exec_mb without a side context);
#  2. the M = 64 line, HEAD ("new") against b718f08 ("old") (the launch refactor must not move it);
#  3. the MoE layer with its side stream (HEAD), the figure item 5 is judged by;
#  4. the table patch: M = 128 and 256, patched ("new") against HEAD ("old"), three times each way.
set -u
source scripts/device_env.sh
gpu_suites
kernels_ab 2 64 $B/apps/fanout $B/fanout_b7
run_line "layer HEAD" layer $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.json
for m in 128 256; do kernels_ab 3 $m $B/fanout_tbl $B/apps/fanout; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
