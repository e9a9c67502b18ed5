#!/usr/bin/env bash
# W = 128 x 192 tiles (one n192 wgmma per K step, per-64-column W scales) added beside the others.
# Its GEMM tests, then the dense shapes with the tile forced: 128x256/1c2 (the table's prefill tile)
# against 128x192/1c2 and /1, alternating, at M = 4096 and 1024; then the grouped bench (masked
# variants and contiguous with 128x192/1c2). SM clock and power sampled throughout.
# (Ran as .carry/run79.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv -lms 100 > $L/smi.csv 2>&1 &
smi=$!
timeout 150 $B/tests/ops/ops_cuda_test > $L/ops_cuda_test.txt 2>&1
echo "ops_cuda_test rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_cuda_test.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]" $L/ops_cuda_test.txt | head -5 >> $S
i=0
for m in 4096 1024; do
  for cfg in 128x256/1c2 128x192/1c2 128x192/1 128x256/1c2 128x192/1c2 128x192/1; do
    i=$((i+1)); tag=$(echo $cfg | tr '/' '_')
    echo "mark $m $cfg $(date +%s.%N)" >> $L/marks.txt
    timeout 60 $B/apps/fanout bench kernels --no-grouped --m $m --config $cfg --json $L/d_$m.$tag.$i.json > $L/d_$m.$tag.$i.txt 2>&1
    echo "== $m $cfg rc=$? t=$(( $(date +%s) - t0 ))" >> $S
    grep -E "^[a-z].* $m " $L/d_$m.$tag.$i.txt | cut -c1-40 | tr -s ' ' | tr '\n' ';' >> $S; echo >> $S
  done
done
timeout 120 $B/apps/fanout bench kernels --no-dense --json $L/grouped.json > $L/grouped.txt 2>&1
echo "== grouped rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep -E "GEMMs|^EP" $L/grouped.txt | cut -c1-60,95-220 >> $S
kill $smi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
