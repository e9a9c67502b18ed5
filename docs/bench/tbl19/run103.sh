#!/usr/bin/env bash
# Eighteenth session: the decode GEMM's time against K (W [7168, K], M = 64, 64 x 64 tiles split 1
# and 2, W rotated over copies) beside read16 and the bare TMA stream of the same bytes, twice:
# the intercept is what a launch costs besides its bytes, the slope its rate.
# Run from the repository root.
# (The probe loop: run_line of scripts/device_env.sh since the eighteenth session's review, the
# same commands it ran inline.)
set -u
source scripts/device_env.sh
for i in 1 2; do run_line "kscan $i" kscan.$i $B/tma_read_probe_k kscan; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
