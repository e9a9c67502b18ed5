#!/usr/bin/env bash
# Twenty-fifth session, the final binaries (pairs from 1,024 expected rows; the short-tile split
# reverted): the GEMM suite (now with the default's pairs at expected_m 1,024) and item 2's table.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
run_line "grouped final" grouped.final $B/apps/fanout bench kernels --no-dense --json $L/grouped.final.json
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
