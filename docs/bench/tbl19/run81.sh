#!/usr/bin/env bash
# Does the data move the prefill GEMMs' time under the power limit? o_proj and q_b at M = 4096,
# table tile (o_proj forced to the tile kernel) and cuBLASLt, with --data uniform / normal / zeros,
# twice each, alternating; SM clock and power sampled (100 ms).
# (Ran as .carry/run81.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $L/smi.csv 2>&1 &
smi=$!
i=0
for rep in 1 2; do
  for data in uniform normal zeros; do
    i=$((i+1))
    echo "mark $data $(date +%s.%N)" >> $L/marks.txt
    timeout 60 $B/apps/fanout bench kernels --no-grouped --m 4096 --config 128x256/1c2 --data $data --json $L/d_$data.$i.json > $L/d_$data.$i.txt 2>&1
    echo "== $data rc=$? t=$(( $(date +%s) - t0 ))" >> $S
    head -1 $L/d_$data.$i.txt >> $S
    grep -E "^[a-z].* 4096 " $L/d_$data.$i.txt | cut -c1-30,80-110 >> $S
  done
done
kill $smi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
