#!/usr/bin/env bash
# Eighteenth session, first call: the TMA-only read probe (docs/bench/tbl19/tma_read_probe.cu, W
# streamed into a ring with nothing consuming it, against read16), then every GPU suite on the
# final commit of the seventeenth session (10d9d23's host code had not run on a GPU), the M = 64
# sweep and the M = 64 line twice. Run from the repository root.
set -u
source scripts/device_env.sh
timeout 120 $B/tma_read_probe > $L/tma_read_probe.txt 2>&1
echo "tma_read_probe rc=$? t=$(( $(date +%s) - t0 ))" >> $S; cat $L/tma_read_probe.txt >> $S
gpu_suites
timeout 200 $B/apps/fanout bench kernels --no-grouped --sweep --m 64 --json $L/sweep64.json > $L/sweep64.txt 2>&1
echo "sweep64 rc=$? t=$(( $(date +%s) - t0 ))" >> $S
for i in 1 2; do m64_line "run $i" m64.$i $B/apps/fanout; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
