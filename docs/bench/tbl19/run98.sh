#!/usr/bin/env bash
# Eighteenth session: run97's TMA-only probe read ~3.2 TB/s at o_proj's W size (117 MB) and 4.0-4.2
# at 1 GiB, for every box shape and depth, single launches. Here: read16 and the TMA stream at
# each decode GEMM's W size, one launch and a graph of 20 (as `bench kernels` times), warm and
# rotating over copies; then the M = 64 line warm, --cold and --serial. Run from the repository root.
# (The probe loop: run_line of scripts/device_env.sh since the eighteenth session's review, the
# same commands it ran inline.)
set -u
source scripts/device_env.sh
for i in 1 2; do run_line "tma_read_probe sized" sized.$i $B/tma_read_probe sized; done
m64_line "warm" m64.warm $B/apps/fanout
timeout 100 $B/apps/fanout bench kernels --no-grouped --m 64 --cold --json $L/m64.cold.json > $L/m64.cold.txt 2>&1
echo "m64 cold: $(grep -A1 '^sum over' $L/m64.cold.txt | tail -1)" >> $S; grep -E "^[a-z].* 64 " $L/m64.cold.txt >> $S
timeout 100 $B/apps/fanout bench kernels --no-grouped --m 64 --cold --serial --json $L/m64.cs.json > $L/m64.cs.txt 2>&1
echo "m64 cold serial: $(grep -A1 '^sum over' $L/m64.cs.txt | tail -1)" >> $S; grep -E "^[a-z].* 64 " $L/m64.cs.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
