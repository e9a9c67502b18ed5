#!/usr/bin/env bash
# Twenty-third session, final code (run118.sh as staged by the twenty-second session). Every GPU suite
# on the session's code — its GPU-side changes are test shapes only (V3's router GEMM at 61 and
# 256 rows, a long-K BF16 GEMM onto a residual); the rest is host code the CPU tests ran — then the
# attention alone (`bench mla`) beside the layer in one call: the layer's attention reads 589-598 µs
# where `bench mla` read 572-579 on earlier machines, and only one machine can tell whether the gap
# is real — and whether it is the layout (`--head-major`: Q and O as the layer holds them) or what
# runs before. Carry: HEAD's build (/tmp/pack.sh).
set -u
source scripts/device_env.sh
gpu_suites
for i in 1 2; do
  run_line "mla b128 token-major $i" mla.tm.$i $B/apps/fanout bench mla --batches 128 --prefill '' --json $L/mla.tm.$i.json
  run_line "mla b128 head-major $i" mla.hm.$i $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.$i.json
  run_line "layer $i" layer.$i $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
