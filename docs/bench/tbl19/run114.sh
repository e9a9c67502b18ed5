#!/usr/bin/env bash
# NOT RUN (written in the nineteenth session for the first session that is lent nvidia-h200-x2).
# Issue 19 item 6: EP dispatch/combine latency on two H200s against its targets (128 tokens per
# rank <= 19 + 27 µs, 1 token per rank <= 12 µs each; pplx-kernels 25.2 + 35.7 at 128). Pack the
# carry as usual (no extra binaries), then run from the repository root with
# kind nvidia-h200-x2. The EP suites and the layer through scripts/gpu_ep_check.sh (its bench comm
# at the default points), then bench comm at the item's two points twice more.
set -u
source scripts/device_env.sh
# On two GPUs: GemmFp8Cuda.EveryDeviceOfOneProcess and MlaCuda.EveryDeviceOfOneProcess (twentieth
# session) launch on device 1 first, then 0 — the per-device kernel attributes' real check.
for t in ops/ops_cuda_test ops/mla_cuda_test; do test_line $t; done
# The layer with real dispatch and combine across the two GPUs (EP2; issue 16's target at batch 128
# per rank <= 1,300 µs, never measured: it needs one process to drive both GPUs' FP8 GEMMs, which
# the per-device attributes of the twentieth session make possible).
LAYER_ARGS="--comm nvlink --eps 8 --batches 1,8,128 --replays 10" OUT=$L/ep bash scripts/gpu_ep_check.sh $B > $L/gpu_ep_check.txt 2>&1  # its own logs.tgz under logs/ep
echo "gpu_ep_check rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "^(PASS|FAIL)" $L/gpu_ep_check.txt >> $S
for i in 1 2; do
  run_line "comm $i" comm.$i $B/apps/fanout bench comm --tokens 1,128 --json $L/comm.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
