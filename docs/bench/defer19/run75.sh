#!/usr/bin/env bash
# The tile's epilogue deferred past the next tile's first wgmmas: S = HEAD (3e60d0e), D1 = deferred
# on every tile shape but 64 x 64, D2 = only where acc is 64 floats and there are <= 2 consumer
# warpgroups (no spills). GEMM tests of D1 and D2, then dense and grouped benches alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
for v in D1 D2; do
  timeout 120 $B/tests/ops/ops_$v > $L/tests_$v.txt 2>&1
  echo "tests $v rc=$? $(grep -E '^\[  (PASSED|FAILED)' $L/tests_$v.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/tests_$v.txt | head -5 >> $S
done
i=0
for v in S D1 D2 S D1 D2; do
  i=$((i+1))
  timeout 70 $B/apps/fanout_$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
done
for v in S D1 D2 S D1 D2; do
  i=$((i+1))
  timeout 60 $B/apps/fanout_$v bench kernels --no-dense --json $L/grouped_$v.$i.json > $L/grouped_$v.$i.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "GEMMs|^EP(8|32|64) +[47]" $L/grouped_$v.$i.txt | cut -c1-100 >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
