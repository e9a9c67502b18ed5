#!/usr/bin/env bash
# Twenty-ninth session, after the review: ops_cuda_test with the masked graph test's new forced
# configs (128 x 128 unpaired and in pairs). Before the call: ninja -C build && scripts/pack_carry.sh build
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
