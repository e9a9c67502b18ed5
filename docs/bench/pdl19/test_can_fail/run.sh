#!/usr/bin/env bash
# pdl_cuda_test on the final binaries (5 repeats) and on a build with pdl_enter() removed from the norm, the router and fill (must fail there).
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib
B=.carry/build
for t in pdl_cuda_test pdl_cuda_test_broken; do
  timeout 60 $B/tests/ops/$t --gtest_repeat=5 > $OUT/$t.txt 2>&1; echo "$t rc=$?" >> $OUT/summary.txt
  grep -E "^\[  (PASSED|FAILED) |Failure|read its input|ran after|Expected|Which is" $OUT/$t.txt | sort | uniq -c | head -20 >> $OUT/summary.txt
done
cat $OUT/summary.txt
