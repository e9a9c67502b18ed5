#!/usr/bin/env bash
# The router's placement policies on the CPU machine: 4 `fanout engine` processes on the tiny
# model behind `fanout router`, driven by `fanout bench serve --turns` (multi-turn conversations,
# each turn extending the previous prompt; FIRST_WORDS: a long opening, as a document) once per policy
# (MODE=dp: the DP ranks of one `fanout serve --ep 4` instead); then the router's own overhead: the
# same short requests straight to an engine's `fanout serve`-equivalent path vs through the router.
#   scripts/bench_router_cpu.sh BUILD_DIR OUT_DIR
set -uo pipefail
build=${1:-build}
out=${2:-/tmp/bench_router}
fanout=$build/apps/fanout
mkdir -p "$out"
export FANOUT_CACHE=${FANOUT_CACHE:-$build/model-cache}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
wait_for() {  # wait_for FILE PATTERN
    for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "timed out waiting for '$2' in $1"; return 1
}
http_port() { sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$1"; }  # http_port LOG
stop_all() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    pids=()
}
threads=${THREADS_PER_ENGINE:-1}
bench() {  # bench PORT NAME: the multi-turn workload against the server on PORT
    "$fanout" bench serve --base-url "http://127.0.0.1:$1" --endpoint completions --turns ${TURNS:-6} \
        --first-turn-len ${FIRST_WORDS:-0} \
        -n ${REQUESTS:-192} --max-concurrency ${CONCURRENCY:-8} --prompt-len ${WORDS:-60} --output-len ${OUTPUT:-8} \
        --seed 7 --json "$out/$2.json" | tee "$out/bench_$2.txt" | grep -E "throughput|hit rate|cached|TTFT|failed"
}
# MODE=dp: the same policies inside one `fanout serve --ep 4` (4 DP ranks as threads, rank 0 placing
# requests on them: the in-process router) instead of 4 engine processes behind `fanout router`.
if [[ ${MODE:-router} == dp ]]; then
    for policy in ${POLICIES:-prefix least-load round-robin}; do
        "$fanout" serve --model tiny --port 0 --ep 4 --threads "$threads" --kv-memory-gb 0.2 --dp-policy "$policy" \
            2> "$out/dp_$policy.log" &
        pids+=($!)
        wait_for "$out/dp_$policy.log" "listening" || exit 1
        echo "=== serve --ep 4 --dp-policy $policy"
        bench "$(http_port "$out/dp_$policy.log")" "dp_$policy"
        stop_all
    done
    exit 0
fi
for policy in ${POLICIES:-prefix least-load round-robin}; do
    engines=()
    for i in 0 1 2 3; do
        "$fanout" engine --model tiny --port 0 --threads "$threads" --kv-memory-gb 0.2 2> "$out/engine_${policy}_$i.log" &
        pids+=($!)
    done
    for i in 0 1 2 3; do
        wait_for "$out/engine_${policy}_$i.log" "serving grpc" || exit 1
        engines+=(--engine "127.0.0.1:$(sed -n 's/.*grpc:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/engine_${policy}_$i.log")")
    done
    "$fanout" router --model tiny --port 0 --policy "$policy" ${ROUTER_ARGS:-} "${engines[@]}" 2> "$out/router_$policy.log" &
    pids+=($!)
    wait_for "$out/router_$policy.log" "listening" || exit 1
    sleep 1  # every engine healthy, KV streams open
    echo "=== policy $policy"
    bench "$(http_port "$out/router_$policy.log")" "router_$policy"
    stop_all
done

# The router's overhead: one engine behind `fanout serve` (HTTP straight to the engine) vs the same
# engine behind `fanout router` (HTTP → router → gRPC → engine); short streamed requests one at a
# time (the added latency), then many at once (the router's CPU time per streamed token).
if [[ ${OVERHEAD:-1} == 1 ]]; then
    cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/$1/stat"; }  # utime + stime, clock ticks of 10 ms
    "$fanout" serve --model tiny --port 0 --threads "$threads" --kv-memory-gb 0.2 2> "$out/direct.log" &
    direct=$!; pids+=($direct)
    wait_for "$out/direct.log" "listening" || exit 1
    dport=$(http_port "$out/direct.log")
    "$fanout" engine --model tiny --port 0 --threads "$threads" --kv-memory-gb 0.2 2> "$out/engine_overhead.log" &
    pids+=($!)
    wait_for "$out/engine_overhead.log" "serving grpc" || exit 1
    eport=$(sed -n 's/.*grpc:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$out/engine_overhead.log")
    "$fanout" router --model tiny --port 0 --engine "127.0.0.1:$eport" 2> "$out/router_overhead.log" &
    router=$!; pids+=($router)
    wait_for "$out/router_overhead.log" "listening" || exit 1
    rport=$(http_port "$out/router_overhead.log")
    sleep 1
    for who in direct router; do
        port=$([[ $who == direct ]] && echo "$dport" || echo "$rport")
        echo "=== $who: 64 requests one at a time (8 words, 16 tokens)"
        "$fanout" bench serve --base-url "http://127.0.0.1:$port" --endpoint completions -n 64 --max-concurrency 1 \
            --prompt-len 8 --output-len 16 --json "$out/overhead_$who.json" > "$out/overhead_$who.txt"
        grep -E "TTFT|TPOT|E2E" "$out/overhead_$who.txt"
    done
    echo "=== router: 512 requests, 64 at once (64 tokens each): its CPU time per streamed token"
    before=$(cpu_s "$router")
    "$fanout" bench serve --base-url "http://127.0.0.1:$rport" --endpoint completions -n 512 --max-concurrency 64 \
        --prompt-len 8 --output-len 64 --json "$out/router_load.json" > "$out/router_load.txt"
    after=$(cpu_s "$router")
    grep -E "output throughput|duration" "$out/router_load.txt"
    tokens=$(python3 -c "import json; print(json.load(open('$out/router_load.json'))['total_output_tokens'])")
    python3 -c "c=$after-$before; t=$tokens; print(f'router CPU {c:.2f} s for {t} streamed tokens: {t/max(c,1e-9):.0f} tokens/s per core of routing')" |
        tee "$out/router_cpu.txt"
fi
