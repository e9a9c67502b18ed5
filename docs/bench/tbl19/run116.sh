#!/usr/bin/env bash
# Twenty-first session, one H200. Carry: HEAD's build (/tmp/pack.sh) plus build/fanout_tbl (a2d638b
# with the table patch: the GEMM code just before the split-K ticket, run115's "new"). Checks:
#  1. every GPU suite on HEAD (the split-K ticket; GemmFp8Cuda.SplitGemmsOnTwoStreamsAtOnce and the
#     workspace-at-zero check; the EP exec without local-permute buffers);
#  2. the split tests under compute-sanitizer (memcheck, racecheck of shared memory);
#  3. the ticket's cost: M = 64 (three split shapes) and M = 128 (o_proj 64 × 128 / 2 in pairs),
#     HEAD ("new") against fanout_tbl ("old");
#  4. the layer (item 5's figure).
set -u
source scripts/device_env.sh
gpu_suites
for tool in memcheck racecheck; do
  timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/tests/ops/ops_cuda_test \
    --gtest_filter='GemmFp8Cuda.Split*:GemmFp8Cuda.EveryTileShape*' > $L/sanitizer_$tool.txt 2>&1
  echo "sanitizer $tool rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|ERROR SUMMARY' $L/sanitizer_$tool.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
done
kernels_ab 3 64 $B/apps/fanout $B/fanout_tbl
kernels_ab 2 128 $B/apps/fanout $B/fanout_tbl
run_line "layer HEAD" layer $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.json
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
