#!/usr/bin/env bash
# Soak run of `fanout serve --model tiny` under AddressSanitizer + LeakSanitizer, driven by the same
# ASan binary's `fanout bench serve --server-pid` (RSS, threads and open fds sampled every 0.5 s):
#   A. baseline: 1,000 streamed requests, 32 in flight, 32-word prompts, 8 output tokens -> p99;
#   B. the same with 1,000 slow clients connected (each sends a request head one byte per second
#      and is reconnected when the server drops it at its 10 s head deadline) -> p99 beside A;
#   C. 10,000 mixed requests (streamed=5, plain=2, cancelled=2, malformed=1) with 200 slow clients.
# Then SIGTERM; the server must exit 0 and its log hold no LeakSanitizer / AddressSanitizer report.
# The configured caches are the paged KV cache (--kv-memory-gb 1, resident from the start: ~1.3 GB
# RSS before the first request) and the prefix cache inside it. RSS rises ~250 MB during A, about
# the size of ASan's quarantine of freed memory (256 MB by default), so compare phase C's
# after-warm-up and last samples.
#
# Usage: scripts/soak_serve.sh [OUT_DIR]   (default docs/bench/soak: A/B/C JSON and tables, the
#        server log, summary.txt). Exit status 1 when any request failed or a sanitizer reported.
# Time: on the 2-vCPU dev machine ASan runs `tiny` ~10x slower than Release (2-4 requests/s at
#       32 in flight), so the defaults take about an hour (A 7, B 7, C 42 minutes, plus the build);
#       N_BASE=500 N_MIX=3000 gives a ~20 minute run.
# Env:   SKIP_BUILD=1 uses build-asan as it is; JOBS (ninja -j, default 1); N_BASE (1000), N_MIX
#        (10000), SLOW_B (1000), SLOW_C (200), CONCURRENCY (32), PROMPT_LEN (32), OUTPUT_LEN (8).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/bench/soak}
n_base=${N_BASE:-1000} n_mix=${N_MIX:-10000} slow_b=${SLOW_B:-1000} slow_c=${SLOW_C:-200}
conc=${CONCURRENCY:-32} plen=${PROMPT_LEN:-32} olen=${OUTPUT_LEN:-8}
mix=streamed=5,plain=2,cancelled=2,malformed=1
mkdir -p "$out"
t0=$SECONDS

if [[ ${SKIP_BUILD:-0} != 1 ]]; then
    echo "building build-asan (fanout, CPU only, -fsanitize=address) ..."
    cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFANOUT_WITH_CUDA=OFF \
        -DFANOUT_BUILD_TESTS=OFF -DCMAKE_CXX_FLAGS="-fsanitize=address -fno-omit-frame-pointer" \
        -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address > /dev/null
    ninja -C build-asan -j"${JOBS:-1}" fanout
fi
build_s=$((SECONDS - t0))
fanout=build-asan/apps/fanout
[[ -x $fanout ]] || { echo "no $fanout (run without SKIP_BUILD=1)" >&2; exit 2; }

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0
log=$out/server.log
"$fanout" serve --model tiny --port 0 2> "$log" &
pid=$!
trap 'kill "$pid" 2> /dev/null || true' EXIT
port=
for _ in $(seq 600); do  # ASan startup is slow: up to 2 minutes
    port=$(sed -n 's|.*listening on http://[^ ]*:\([0-9][0-9]*\) .*|\1|p' "$log" | head -1)
    [[ -n $port ]] && break
    kill -0 "$pid" 2> /dev/null || { echo "the server exited at start:" >&2; cat "$log" >&2; exit 1; }
    sleep 0.2
done
[[ -n $port ]] || { echo "the server did not start listening" >&2; exit 1; }
url=http://127.0.0.1:$port
echo "server pid $pid on $url (log $log)"

failed=0
phase() {  # phase NAME ARGS... : one `bench serve` run; table in NAME.txt, JSON in NAME.json
    local name=$1
    shift
    echo "phase $name: $*"
    local t=$SECONDS rc=0
    "$fanout" bench serve --base-url "$url" --server-pid "$pid" --max-concurrency "$conc" --prompt-len "$plen" \
        --output-len "$olen" --timeout 300 --json "$out/$name.json" "$@" > "$out/$name.txt" 2> "$out/$name.stderr" ||
        rc=$?
    tail -n +2 "$out/$name.txt"
    echo "phase $name: exit $rc, $((SECONDS - t)) s"
    if ((rc != 0)); then failed=1; fi
    if grep -q "Sanitizer" "$out/$name.stderr"; then
        echo "the load generator itself reported (see $out/$name.stderr)"
        failed=1
    fi
    [[ -s $out/$name.stderr ]] || rm -f "$out/$name.stderr"
}
phase A_baseline -n "$n_base" --seed 11
phase B_slow_clients -n "$n_base" --seed 12 --slow-clients "$slow_b"
phase C_mixed -n "$n_mix" --seed 13 --mix "$mix" --slow-clients "$slow_c"

echo "stopping the server (SIGTERM) ..."
kill -TERM "$pid" 2> /dev/null || echo "the server had already exited"
server_rc=0
wait "$pid" || server_rc=$?
trap - EXIT
reports=$(grep -cE "ERROR: (LeakSanitizer|AddressSanitizer)|SUMMARY: AddressSanitizer" "$log" || true)
if ((reports == 0 && server_rc == 0)); then
    verdict="clean: no LeakSanitizer / AddressSanitizer report, server exit 0"
else
    verdict="FAILED: $reports sanitizer report line(s), server exit $server_rc (see $log)"
    failed=1
fi

node -e '
const [dir, verdict, total, build] = process.argv.slice(1);
const load = n => require(require("path").resolve(dir, n + ".json"));
const A = load("A_baseline"), B = load("B_slow_clients"), C = load("C_mixed");
const f = x => x.toFixed(1);
const lat = j => `TTFT p50 ${f(j.ttft_ms.p50)} p99 ${f(j.ttft_ms.p99)}  E2E p50 ${f(j.e2e_ms.p50)} p99 ${f(j.e2e_ms.p99)} ms`;
const ok = j => `${j.requests_ok}/${j.requests_ok + j.requests_failed} ok`;
const slow = j => { const s = j.slow_clients; return `${s.clients} slow clients: ${f(s.mean_open)} open on average ` +
  `(min ${s.min_open}), ${s.reconnects} reconnects, ${s.connect_failures} connect failures`; };
const L = [];
L.push(`A baseline     ${ok(A)}  ${lat(A)}  ${A.request_throughput.toFixed(1)} req/s`);
L.push(`B slow clients ${ok(B)}  ${lat(B)}  ${B.request_throughput.toFixed(1)} req/s`);
L.push(`               ${slow(B)}`);
L.push(`  p99 B / A: TTFT ${(B.ttft_ms.p99 / A.ttft_ms.p99).toFixed(2)}x, E2E ${(B.e2e_ms.p99 / A.e2e_ms.p99).toFixed(2)}x`);
L.push(`C mixed        ${ok(C)}  ${C.duration_s.toFixed(0)} s, ${C.request_throughput.toFixed(1)} req/s; ${slow(C)}`);
for (const k of ["streamed", "plain", "cancelled", "malformed"].filter(k => k in C.by_kind)) {
  const v = C.by_kind[k];
  let s = `  ${k.padEnd(10)} ${String(v.count).padStart(5)} requests, ${v.failed} failed`;
  if (k === "streamed") s += `  TTFT p50 ${f(v.ttft_ms.p50)} p99 ${f(v.ttft_ms.p99)}  E2E p50 ${f(v.e2e_ms.p50)} p99 ${f(v.e2e_ms.p99)} ms`;
  if (k === "plain") s += `  E2E p50 ${f(v.e2e_ms.p50)} p99 ${f(v.e2e_ms.p99)} ms`;
  if (k === "malformed") s += `  HTTP ${JSON.stringify(v.statuses)}`;
  if (v.failed) s += `  first error: ${v.first_error}`;
  L.push(s);
}
const P = C.server_process, mib = kb => (kb / 1024).toFixed(1);
if (P.first) {
  L.push(`C server RSS MiB  first ${mib(P.first.rss_kb)}  after warm-up (${P.after_warmup.requests_done} done) ${mib(P.after_warmup.rss_kb)}` +
    `  last ${mib(P.last.rss_kb)}  max ${mib(P.max.rss_kb)}  (${P.num_samples} samples)`);
  L.push(`C server threads  first ${P.first.threads}  after warm-up ${P.after_warmup.threads}  last ${P.last.threads}  max ${P.max.threads}`);
  L.push(`C server fds      first ${P.first.fds}  after warm-up ${P.after_warmup.fds}  last ${P.last.fds}  max ${P.max.fds}`);
}
const rss = j => j.server_process.first ? mib(j.server_process.first.rss_kb) + "->" + mib(j.server_process.last.rss_kb) : "?";
L.push(`server RSS MiB per phase (first->last): A ${rss(A)}, B ${rss(B)}, C ${rss(C)}`);
L.push(`sanitizers: ${verdict}`);
L.push(`total ${total} s (build ${build} s)`);
console.log(L.join("\n"));
' "$out" "$verdict" "$((SECONDS - t0))" "$build_s" | tee "$out/summary.txt" ||
    { echo "no summary (a phase wrote no JSON); sanitizers: $verdict" | tee "$out/summary.txt"; failed=1; }
exit $failed
