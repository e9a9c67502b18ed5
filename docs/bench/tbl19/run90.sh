#!/usr/bin/env bash
# The session's final code (the 128 x 192 fold, the masked layout's 256-wide tiles on K <= 2048):
# every GPU suite, the microbatch and serve checks; then the masked default A/B inside one call —
# `bench kernels --no-dense` and `bench layer --batches 128 --eps 8,32,64` with this build and with
# fanout_old (the previous rule: 128-wide past 128 tokens per expert), alternating.
# Run from the repository root: bash docs/bench/tbl19/run90.sh
set -u
source scripts/device_env.sh
OLD=.carry/old/fanout_old
for t in ops/ops_cuda_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
timeout 90 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1; echo "microbatch tiny rc=$? $(grep -cE '^PASS' $L/microbatch_tiny.txt) PASS $(grep -cE '^FAIL' $L/microbatch_tiny.txt) FAIL t=$(( $(date +%s) - t0 ))" >> $S
for d in bf16 fp8; do
  $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
  server=$!
  for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
  timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $S
  kill $server; wait $server 2>/dev/null
done
for i in 1 2; do
  for v in new old; do
    bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
    timeout 120 $bin bench kernels --no-dense --json $L/grouped.$v.$i.json > $L/grouped.$v.$i.txt 2>&1
    echo "grouped $v run $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
    grep -E "^EP[0-9]+ +(4096|7168)x" $L/grouped.$v.$i.txt | head -10 | awk '{print "  " $1, $2, $5, $6}' >> $S
    grep -hE "GEMMs .* vs DeepGEMM" $L/grouped.$v.$i.txt | sed 's/.*GEMMs/  GEMMs/' >> $S
  done
done
for i in 1 2; do
  for v in new old; do
    bin=$B/apps/fanout; [ $v = old ] && bin=$OLD
    timeout 150 $bin bench layer --batches 128 --eps 8,32,64 --replays 10 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
    echo "layer $v run $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
    grep -E "^(MoE layer|grouped_down|grouped_gate_up|layer total|dense layer)" $L/layer.$v.$i.txt | sed 's/^/  /' >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
