#!/usr/bin/env bash
# Twenty-first session, one H200: what racecheck reports on the FP8 GEMM. run116 found hazards on
# the 64-row tiles between the consumers' scale reads and the scale loader's writes; both sides
# hand a stage over by one arrive per warp after __syncwarp. Carry: HEAD's build plus
# build/ops_cuda_test_rpt = HEAD with release_per_thread.patch (every lane arrives on the stage's
# empty and full barriers, the pre-nineteenth-session form). Same filter on both binaries. First
# every GPU suite on HEAD; last the layer (EmulatedEp now names its stream, which the layer checks).
set -u
source scripts/device_env.sh
gpu_suites  # the final code: the review's mends, the duplicate-logit-bias case
for v in head rpt; do
  bin=$B/tests/ops/ops_cuda_test; [[ $v == rpt ]] && bin=$B/ops_cuda_test_rpt
  timeout 200 compute-sanitizer --tool racecheck --error-exitcode 9 $bin \
    --gtest_filter='GemmFp8Cuda.Split*:GemmFp8Cuda.EveryTileShape*' > $L/racecheck_$v.txt 2>&1
  echo "racecheck $v rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|RACECHECK SUMMARY|ERROR SUMMARY' $L/racecheck_$v.txt | tr '\n' ' ') hazard reports: $(grep -c 'Error: Race' $L/racecheck_$v.txt) t=$(( $(date +%s) - t0 ))" >> $S
done
run_line "layer HEAD" layer $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --microbatch --json $L/layer.json
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
