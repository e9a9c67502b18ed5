#!/usr/bin/env bash
# Issue 16 on the GPU machine (the device tool), over binaries built on the CPU machine and carried
# as scripts/prepare_carry.sh makes them:
#   scripts/gpu_ep_check.sh BUILD_DIR
# The GPU runner's expert-parallel path — the tiny model's experts over every visible GPU through
# the nccl and nvlink backends against the runner holding every expert (model_cuda_test
# CudaModelEp.*; world 1 on a one-GPU machine), the glue kernels (add_bf16), the EP backends'
# own tests, the engine on the GPU — then `fanout bench layer` (the EP-N emulated backend) and
# `fanout bench comm` where there are two GPUs. Logs and JSON under $OUT.
set -uo pipefail
build=${1:-.carry/build}
out=${OUT:-/tmp/gpu_ep_out}
logs=/tmp/gpu_ep_logs
mkdir -p "$out" "$logs"
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib 2>/dev/null | head -1)
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fanout-cache
status=0
run() {  # run NAME CMD...: logs to $logs/NAME.log, records pass/fail
    echo "=== $1"
    if "${@:2}" > "$logs/$1.log" 2>&1; then echo "PASS $1"; else echo "FAIL $1 (rc $?)"; tail -30 "$logs/$1.log"; status=1; fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
gpus=$(nvidia-smi -L | wc -l)
for t in ops/glue_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
    run "$(basename $t)" "$build/tests/$t"
    tail -3 "$logs/$(basename $t).log"
done
grep -h "EP\|dlogit" "$logs/model_cuda_test.log" | head -20
run bench_layer "$build/apps/fanout" bench layer ${LAYER_ARGS:-} --json "$out/layer_bench.json"
cp "$logs/bench_layer.log" "$out/layer_bench.txt"
tail -40 "$logs/bench_layer.log"
if [[ $gpus -ge 2 ]]; then
    run bench_comm "$build/apps/fanout" bench comm --json "$out/comm_bench.json"
    tail -20 "$logs/bench_comm.log"
fi
${EXTRA:-true}
tar czf "$out/logs.tgz" -C "$logs" .
exit $status
