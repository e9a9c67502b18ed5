#!/usr/bin/env bash
# The kernel bench's new per-row SM clock (NVML, sampled over each timing's replays): the dense
# shapes with the default data, then with zeros, then the default again.
# (Ran as .carry/run82.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
i=0
for data in uniform zeros uniform; do
  i=$((i+1))
  timeout 80 $B/apps/fanout bench kernels --no-grouped --data $data --json $L/dense_$data.$i.json > $L/dense_$data.$i.txt 2>&1
  echo "== $data rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  head -1 $L/dense_$data.$i.txt >> $S
  grep -E "^(o_proj|q_b|kv_b|fused).* (64|4096) " $L/dense_$data.$i.txt | cut -c1-40,100-200 >> $S
  grep -A6 "^sum over" $L/dense_$data.$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
