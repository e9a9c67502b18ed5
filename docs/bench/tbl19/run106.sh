#!/usr/bin/env bash
# NOT RUN (written in the eighteenth session; the device was withdrawn). The consumer-chain probe:
# does the M = 64 decode GEMM's pipeline stream W faster with more consumer warpgroups per SM?
# Build here (see docs/bench/tbl19/chain_probe.cu's header), put the binary in the carried build
# as build/chain_probe, then run this from the repository root.
set -u
source scripts/device_env.sh
for i in 1 2; do run_line "chain_probe $i" chain.$i $B/chain_probe; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
