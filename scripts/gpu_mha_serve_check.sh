#!/usr/bin/env bash
# Serving with long prompts on the GPU machine (device tool), binaries as scripts/prepare_carry.sh
# makes them, the tokenizer carried:
#   scripts/gpu_mha_serve_check.sh BUILD_DIR
# The V3-width 2-layer FP8 checkpoint behind `fanout serve --device cuda`, prompts of PROMPT_LEN
# words (default 1500, ~2,000 tokens) arriving while others decode — continuous batching's mixed
# steps — served with the prefill chunks' attention in the MHA form (the default) and with
# --mha-max-context 0 (every step in the absorbed form), for each of CONFIGS (default "local
# nvlink:auto": BACKEND[:MICROBATCH] — the local experts, the nvlink EP backend at world 1 with
# --microbatch auto). `fanout bench serve` per configuration (REQUESTS, CONC); every run's figures
# go to $OUT/mha_serve_summary.json.
set -uo pipefail
build=${1:-.carry/build}
out=${OUT:-/tmp/gpu_mha_serve_out}
logs=/tmp/gpu_mha_serve_logs
mkdir -p "$out" "$logs"
source "$(dirname "$0")/gpu_serve_common.sh"
dir=/tmp/v3_2layers_fp8
[[ -f $dir/config.json ]] || "$fanout" make-model --preset full-layers --layers 2 --dtype fp8 --out "$dir" 2>&1 | tail -1
for cfg in ${CONFIGS:-local nvlink:auto}; do
    backend=${cfg%%:*} microbatch=off
    [[ $cfg == *:* ]] && microbatch=${cfg#*:}
    for mha in 16384 0; do
        name=${backend}_mb${microbatch}_mha$mha
        echo "=== V3-width 2 layers, --ep-backend $backend, --microbatch $microbatch, --mha-max-context $mha"
        extra="--microbatch $microbatch"
        if serve_up "$logs/$name.log" "$fanout" serve --model "$dir" --device cuda --port 8300 --max-num-seqs 64 \
            --max-batched-tokens 4096 --prefill-chunk 2048 --ep-backend $backend $extra --mha-max-context $mha; then
            grep -E "memory plan|microbatch auto|listening" "$logs/$name.log" | head -4
            timeout 300 "$fanout" bench serve --base-url http://127.0.0.1:8300 --endpoint completions \
                -n ${REQUESTS:-96} --max-concurrency ${CONC:-32} --prompt-len ${PROMPT_LEN:-1500} --output-len 128 \
                --json "$logs/bench_$name.json" > "$logs/bench_$name.log" 2>&1
            rc=$?
            echo "rc=$rc"; grep -iE "throughput|TTFT|TPOT|failed" "$logs/bench_$name.log" | head -8
            [[ $rc -eq 0 ]] || status=1
            curl -s http://127.0.0.1:8300/metrics | grep -E "^fanout_engine_(microbatch_)?steps_total" | tr '\n' ' '
            echo
            python3 - "$backend" "$microbatch" "$mha" "$logs/bench_$name.json" "$out/mha_serve_summary.json" <<'PY'
import json, os, sys
backend, microbatch, mha, bench, dest = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = json.load(open(dest)) if os.path.exists(dest) else []
rows.append({"ep_backend": backend, "microbatch": microbatch, "mha_max_context": mha,
             "bench": json.load(open(bench)) if os.path.exists(bench) else {}})
json.dump(rows, open(dest, "w"), indent=1)
PY
            serve_down
        fi
    done
done
tar czf "$out/mha_serve_logs.tgz" -C "$logs" .
exit $status
