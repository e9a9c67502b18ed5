#!/usr/bin/env bash
# Eighteenth session: run98 found the TMA stream ~11% under read16 at o_proj's W size in a graph
# (3.66 against 4.11 TB/s) and the GEMM ~5 µs over the TMA stream. Here the same stream through
# cp.async (128 or 64 producer threads) beside TMA and read16; then the final commit's layer (the
# shared expert beside the dispatch) twice, and the M = 256 GEMMs cold and serial as a layer runs
# them. Run from the repository root.
# (The probe loop: run_line of scripts/device_env.sh since the eighteenth session's review, the
# same commands it ran inline.)
set -u
source scripts/device_env.sh
for i in 1 2; do run_line "tma_read_probe sized" sized.$i $B/tma_read_probe sized; done
for i in 1 2; do
  timeout 100 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$i.json > $L/layer.$i.txt 2>&1
  echo "layer $i rc=$? $(grep -E '^layer total' $L/layer.$i.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done
timeout 100 $B/apps/fanout bench kernels --no-grouped --m 256 --cold --serial --json $L/m256.cs.json > $L/m256.cs.txt 2>&1
echo "m256 cold serial rc=$?" >> $S; grep -E "^[a-z].* 256 " $L/m256.cs.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
