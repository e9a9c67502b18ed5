#!/usr/bin/env bash
# The serving benchmark of docs/PERF.md on the CPU path: `fanout serve --model tiny`, then
#   1. a concurrency sweep (1, 4, 16, 64 in flight; 128-word prompts, 32 output tokens; a fresh
#      prompt set per level so earlier levels do not warm the prefix cache), and
#   2. a shared-prefix workload (4 groups of a 400-word prefix + 24 words, 16 output tokens,
#      8 in flight) against servers with and without the prefix cache.
# Usage: scripts/bench_serve_cpu.sh OUT_DIR   (JSON per run + summary.txt)
set -euo pipefail
out=${1:?usage: bench_serve_cpu.sh OUT_DIR}
fanout=${FANOUT:-build/apps/fanout}
mkdir -p "$out"
start_server() {  # start_server PORT ARGS... -> waits until it listens
    "$fanout" serve --model tiny --port "$1" "${@:2}" 2> "$out/serve_$1.log" &
    servers+=($!)
    for _ in $(seq 150); do grep -q "listening on" "$out/serve_$1.log" && return; sleep 0.2; done
    echo "server on $1 did not start" >&2; exit 1
}
servers=()
trap 'kill ${servers[@]} 2>/dev/null || true' EXIT
summary() {  # one line per run from its JSON
    node -e 'const j=require(process.argv[1]);const p=x=>x.p50.toFixed(1);
      console.log(`${process.argv[2].padEnd(28)} ${j.request_throughput.toFixed(2).padStart(7)} req/s ${j.output_throughput.toFixed(0).padStart(6)} out tok/s  TTFT p50 ${p(j.ttft_ms).padStart(7)} p99 ${j.ttft_ms.p99.toFixed(1).padStart(7)} ms  TPOT p50 ${p(j.tpot_ms).padStart(6)} ms  cached/req ${j.mean_cached_tokens.toFixed(0)}`)' \
      "$(realpath "$1")" "$2" | tee -a "$out/summary.txt"
}
: > "$out/summary.txt"
start_server 8301
for c in 1 4 16 64; do
    n=$((c * 4)); ((n < 16)) && n=16
    "$fanout" bench serve --base-url http://127.0.0.1:8301 -n $n --max-concurrency $c --prompt-len 128 \
        --output-len 32 --seed $((100 + c)) --json "$out/concurrency_$c.json" > "$out/concurrency_$c.txt"
    summary "$out/concurrency_$c.json" "concurrency $c"
done
start_server 8302 --no-prefix-cache
for port in 8301 8302; do
    name=$([[ $port == 8301 ]] && echo "prefix cache on" || echo "prefix cache off")
    "$fanout" bench serve --base-url http://127.0.0.1:$port -n 48 --max-concurrency 8 --prefix-groups 4 \
        --prefix-len 400 --prompt-len 24 --output-len 16 --seed 7 --json "$out/prefix_$port.json" > "$out/prefix_$port.txt"
    summary "$out/prefix_$port.json" "shared prefix, $name"
done
