#!/usr/bin/env bash
# The session's final code (the 128 x 192 fold, the masked layout's 256-wide tiles on K <= 2048):
# every GPU suite, the microbatch and serve checks; then the masked default A/B inside one call —
# `bench kernels --no-dense` and `bench layer --batches 128 --eps 8,32,64` with this build and with
# fanout_old (the previous rule: 128-wide past 128 tokens per expert), alternating.
# (The suites: gpu_suites of scripts/device_env.sh, the same commands as run85.sh.)
# Run from the repository root: bash docs/bench/tbl19/run90.sh
set -u
source scripts/device_env.sh
OLD=.carry/old/fanout_old
gpu_suites
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
