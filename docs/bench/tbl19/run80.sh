#!/usr/bin/env bash
# The final table (q_b, kv_b, shared down prefill rows on the tile kernel; qkv_a past 1024 on the
# dense-only 128 x 192 tile): its GEMM tests, three plain dense runs, four layer runs.
# (Ran as .carry/run80.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $L/smi.csv 2>&1 &
smi=$!
timeout 150 $B/tests/ops/ops_cuda_test > $L/ops_cuda_test.txt 2>&1
echo "ops_cuda_test rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_cuda_test.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]" $L/ops_cuda_test.txt | head -5 >> $S
for i in 1 2 3; do
  echo "mark dense $i $(date +%s.%N)" >> $L/marks.txt
  timeout 60 $B/apps/fanout bench kernels --no-grouped --json $L/dense.$i.json > $L/dense.$i.txt 2>&1
  echo "== dense rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense.$i.txt >> $S
done
for i in 1 2 3 4; do
  timeout 45 $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$i.json > $L/layer.$i.txt 2>&1
  echo "== layer rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(layer total)" $L/layer.$i.txt >> $S
done
kill $smi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
