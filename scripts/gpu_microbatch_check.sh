#!/usr/bin/env bash
# Issue 18's two-microbatch schedule on the GPU machine (device tool), binaries as
# scripts/prepare_carry.sh makes them, the tokenizer carried:
#   scripts/gpu_microbatch_check.sh BUILD_DIR [tiny|bench|all]
# tiny:  `fanout serve --device cuda --model tiny --microbatch on` answers the HTTP checks
#        (gpu_serve_check.py) and its greedy text equals --microbatch off's; the same through the
#        nvlink EP backend (world 1: a second backend for the second microbatch), and with
#        --microbatch auto there (the start-up times both schedules and picks).
# bench: the V3-width 2-layer FP8 checkpoint through the nvlink backend (world 1: the exchange's
#        kernels run, nothing crosses a link) with --microbatch auto — its start-up line is both
#        schedules' decode step time at every bucket — then `fanout bench serve` at concurrency
#        MB_CONC (default 8 64) with --microbatch off, on and auto: $OUT/microbatch_summary.json.
set -uo pipefail
build=${1:-.carry/build}
mode=${2:-all}
out=${OUT:-/tmp/gpu_microbatch_out}
logs=/tmp/gpu_microbatch_logs
mkdir -p "$out" "$logs"
source "$(dirname "$0")/gpu_serve_common.sh"

if [[ $mode == tiny || $mode == all ]]; then
    for cfg in "off" "on" "on nvlink" "auto nvlink"; do
        set -- $cfg
        name=tiny_$1${2:+_$2}
        echo "=== tiny, --microbatch $1${2:+ --ep-backend $2}"
        if serve_up "$logs/$name.log" "$fanout" serve --device cuda --model tiny --port 8300 --microbatch $1 \
            ${2:+--ep-backend $2}; then
            grep -E "CUDA graphs|microbatch|decode step" "$logs/$name.log"
            python3 scripts/gpu_serve_check.py http://127.0.0.1:8300 > "$logs/${name}_check.log" 2>&1 &&
                echo "PASS $name" || { echo "FAIL $name"; cat "$logs/${name}_check.log"; status=1; }
            greedy | tee "$logs/${name}_greedy.txt"
            curl -s http://127.0.0.1:8300/metrics | grep -E "^fanout_engine_(microbatch_)?steps_total" |
                tee "$logs/${name}_metrics.txt"
            serve_down
        fi
    done
    for name in tiny_on tiny_on_nvlink tiny_auto_nvlink; do
        # The split changes no logit (model_cuda_test: |Δlogit| 0): any difference is a failure.
        cmp -s "$logs/tiny_off_greedy.txt" "$logs/${name}_greedy.txt" && echo "PASS served greedy $name == off" ||
            { echo "FAIL served greedy $name vs off"; status=1; }
    done
fi

if [[ $mode == bench || $mode == all ]]; then
    dir=/tmp/v3_2layers_fp8
    [[ -f $dir/config.json ]] || "$fanout" make-model --preset full-layers --layers 2 --dtype fp8 --out "$dir" 2>&1 | tail -1
    for m in ${MB_MODES:-auto off on}; do
        echo "=== V3-width 2 layers, nvlink backend (world 1), --microbatch $m"
        if serve_up "$logs/v3_$m.log" "$fanout" serve --model "$dir" --device cuda --port 8300 --max-num-seqs 128 \
            --max-batched-tokens 1024 --ep-backend nvlink --microbatch $m; then
            grep -E "memory plan|CUDA graphs|GPU memory|microbatch|decode step|listening" "$logs/v3_$m.log"
            for c in ${MB_CONC:-8 64}; do
                n=$((c * 3 < 24 ? 24 : c * 3))
                timeout 200 "$fanout" bench serve --base-url http://127.0.0.1:8300 --endpoint completions -n $n \
                    --max-concurrency $c --prompt-len 128 --output-len 64 --json "$logs/mb_${m}_c$c.json" \
                    > "$logs/bench_${m}_c$c.log" 2>&1
                rc=$?
                echo "microbatch=$m c=$c rc=$rc"; grep -iE "throughput|TPOT|ok|failed" "$logs/bench_${m}_c$c.log" | head -6
                [[ $rc -eq 0 ]] || status=1
                curl -s http://127.0.0.1:8300/metrics | grep -E "^fanout_engine_(microbatch_)?steps_total" |
                    tr '\n' ' '; echo
                python3 - "$m" "$c" "$logs/mb_${m}_c$c.json" "$logs/v3_$m.log" "$out/microbatch_summary.json" <<'PY'
import json, os, re, sys
mode, conc, bench, log, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
rows = json.load(open(dest)) if os.path.exists(dest) else []
b = json.load(open(bench)) if os.path.exists(bench) else {}
text = open(log).read()
steps = re.search(r"decode step µs as one batch / two microbatches \(tokens: times\): (.*)", text)
choice = re.search(r"--microbatch auto: (.*)", text)
rows.append({"microbatch": mode, "concurrency": conc, "bench": b,
             "step_times": steps.group(1) if steps else None, "auto_choice": choice.group(1) if choice else None})
json.dump(rows, open(dest, "w"), indent=1)
PY
            done
            serve_down
        fi
    done
fi
tar czf "$out/microbatch_logs.tgz" -C "$logs" .
exit $status
