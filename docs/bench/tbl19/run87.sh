#!/usr/bin/env bash
# W prefetched into L2 ahead of the ring (probe build: FANOUT_PROBE_W_PREFETCH=D sets Params::w_prefetch
# for every launch). run86 found the decode GEMMs at 72-80% of a plain read's bandwidth (4,480 GB/s),
# not held by W's row pitch; the question is whether more bytes in flight (prefetches, which take no
# shared memory) lift them. Dense M = 64 / 128 / 4096 and the grouped points, D = 0 (off) against others.
# Run from the repository root: bash docs/bench/tbl19/run87.sh
# (The M = 64 line: m64_line of scripts/device_env.sh since the seventeenth session's review, the
# same commands this script ran inline.)
set -u
source scripts/device_env.sh
FANOUT_PROBE_W_PREFETCH=8 timeout 200 $B/tests/ops/ops_cuda_test --gtest_filter='GemmFp8*:GroupedGemm*' > $L/ops_gemm_pf8.txt 2>&1
echo "ops_cuda gemm (prefetch 8) rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_gemm_pf8.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
for i in 1 2; do
  for d in 0 4 8 16 32; do
    FANOUT_PROBE_W_PREFETCH=$d m64_line "d=$d run $i" m64.d$d.$i $B/apps/fanout
  done
done
for i in 1 2; do
  for d in 0 16; do
    for m in 128 256 1024 4096; do
      FANOUT_PROBE_W_PREFETCH=$d timeout 90 $B/apps/fanout bench kernels --no-grouped --m $m --json $L/m$m.d$d.$i.json > $L/m$m.d$d.$i.txt 2>&1
      echo "m$m d=$d run $i: $(grep -A1 '^sum over' $L/m$m.d$d.$i.txt | tail -1)" >> $S
    done
  done
done
for d in 0 16 0 16; do
  FANOUT_PROBE_W_PREFETCH=$d timeout 150 $B/apps/fanout bench kernels --no-dense --json $L/grouped.d$d.json > $L/grouped.d$d.$RANDOM.txt 2>&1
  echo "grouped d=$d rc=$? t=$(( $(date +%s) - t0 ))" >> $S
  grep -hE "GEMMs .* vs DeepGEMM|unpaired" $(ls -t $L/grouped.d$d.*.txt | head -1) | sed 's/^/  /' >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
