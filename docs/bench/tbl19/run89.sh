#!/usr/bin/env bash
# The MoE router's gate (bf16 x [M, 7168] · W[256, 7168]^T -> f32) reads 9.8 / 13.0 us inside the
# layer at batch 32 / 128 (floor ~2 us): cuBLASLt's heuristic's first choice. ltprobe_router.cc
# times the heuristic's results and split-K variants of them. Run from the repository root.
set -u
source scripts/device_env.sh
timeout 120 .carry/ltprobe > $L/ltprobe.txt 2>&1; echo "ltprobe rc=$?" >> $S
cat $L/ltprobe.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
