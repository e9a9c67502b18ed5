#!/usr/bin/env bash
# Twenty-fifth session: a masked 128-row tile of at most 64 rows split by columns between its two
# consumer warpgroups (new) against 7a31f64's binary (fanout_c2: pairs from 1,024 expected rows).
# The GEMM and model suites on new, then `bench kernels --no-dense` and `bench layer --eps 8,16`
# at batches 32 and 128, alternating (one round each: the session's device time was nearly spent).
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
test_line model/model_cuda_test
run_line "grouped new" grouped.new $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.json
run_line "grouped old" grouped.old $B/fanout_c2 bench kernels --no-dense --json $L/grouped.old.json
run_line "layer new" layer.new $B/apps/fanout bench layer --batches 32,128 --eps 8,16 --replays 10 --json $L/layer.new.json
run_line "layer old" layer.old $B/fanout_c2 bench layer --batches 32,128 --eps 8,16 --replays 10 --json $L/layer.old.json
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
