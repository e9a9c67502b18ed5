#!/usr/bin/env bash
# R = the tile table at prefill (q_b, kv_b, shared down on the tile kernel) + one empty-barrier
# arrive per consumer warp instead of per thread; T = the table alone (kernels = HEAD's).
# R's GPU suites, then grouped and dense benches alternating T / R, with the SM clock and power
# sampled throughout (nvidia-smi, 100 ms).
# (Ran as .carry/run78.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $L/smi.csv 2>&1 &
smi=$!
for t in ops/ops_cuda_test ops/glue_cuda_test model/model_cuda_test engine/engine_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
i=0
for v in fanout_T fanout fanout_T fanout; do
  i=$((i+1))
  echo "mark grouped $v $(date +%s.%N)" >> $L/marks.txt
  timeout 60 $B/apps/$v bench kernels --no-dense --json $L/grouped_$v.$i.json > $L/grouped_$v.$i.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "GEMMs|^EP(8|32|64) +[47]" $L/grouped_$v.$i.txt | cut -c1-100 >> $S
done
for v in fanout_T fanout fanout_T fanout; do
  i=$((i+1))
  echo "mark dense $v $(date +%s.%N)" >> $L/marks.txt
  timeout 60 $B/apps/$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
  [ $(( $(date +%s) - t0 )) -gt 450 ] && break
done
kill $smi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
