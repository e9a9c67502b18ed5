#!/usr/bin/env bash
# `fanout router` in front of 4 `fanout engine` processes on the tiny model, end to end: the
# official openai npm client through the router (serve_client.mjs: chat and completions, streamed
# and not, 200 concurrent streams), bad input answered as `fanout serve` answers it, requests that
# share a prefix served from one engine's cache, an engine killed mid-stream (that stream ends with
# the 503-style error, the next requests succeed elsewhere, the engine rejoins when restarted), and
# SIGTERM stopping the router with exit status 0.
# Usage: router_test.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/e2e/common.sh"

# start_engine I [PORT]: engine I on PORT (0: any free one); sets engine_port[I], engine_pid[I].
declare -a engine_port engine_pid
start_engine() {
    local i=$1 port=${2:-0}
    "$fanout" engine --model tiny --kv-memory-gb 0.4 --port "$port" 2> "$work/engine$i.log" &
    engine_pid[$i]=$!
    servers+=("${engine_pid[$i]}")
    engine_port[$i]=
    for _ in $(seq 300); do
        engine_port[$i]=$(sed -n 's/.*serving grpc:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/engine$i.log")
        [[ -n ${engine_port[$i]} ]] && return 0
        kill -0 "${engine_pid[$i]}" 2>/dev/null || break
        sleep 0.1
    done
    bad "engine $i did not start" "$(tail -3 "$work/engine$i.log")"
    return 1
}
for i in 0 1 2 3; do start_engine $i || { echo "$passed passed, $failed failed"; exit 1; }; done
args=()
for i in 0 1 2 3; do args+=(--engine "127.0.0.1:${engine_port[$i]}"); done
"$fanout" router --model tiny --port 0 "${args[@]}" 2> "$work/router.log" &
router_pid=$!
servers+=("$router_pid")
port=
for _ in $(seq 300); do
    port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/router.log")
    [[ -n $port ]] && break
    sleep 0.1
done
[[ -n $port ]] || { bad "router did not start" "$(tail -5 "$work/router.log")"; echo "$passed passed, $failed failed"; exit 1; }
base=http://127.0.0.1:$port
for _ in $(seq 50); do [[ $(grep -c "is healthy" "$work/router.log") -ge 4 ]] && break; sleep 0.1; done
[[ $(grep -c "is healthy" "$work/router.log") -ge 4 ]] && ok "router: 4 engines healthy" || bad "router: engines" "$(cat "$work/router.log")"

# The official client, as against `fanout serve`.
node "$root/tests/e2e/serve_client.mjs" "$base" > "$work/client.log" 2>&1
client_rc=$?
sed -n 's/^\(PASS\|FAIL\) /\1 router: /p' "$work/client.log"
passed=$((passed + $(grep -c '^PASS' "$work/client.log")))
failed=$((failed + $(grep -c '^FAIL' "$work/client.log")))
[[ $client_rc -eq 0 ]] || grep -q '^FAIL' "$work/client.log" || bad "router: openai client" "exit $client_rc"

# Bad input: the same answers as `fanout serve`.
status() {
    local want=$1 name=$2; shift 2
    local got
    got=$(curl -s -o "$work/body" -w '%{http_code}' -H content-type:application/json "$@")
    if [[ $got == "$want" ]] && { [[ $want == 2* ]] || grep -q '"error"' "$work/body"; }; then ok "router: $name ($got)";
    else bad "router: $name" "status $got, body $(head -c 300 "$work/body")"; fi
}
status 400 "invalid JSON" --data-binary '{bad' "$base/v1/chat/completions"
status 400 "token id past the vocabulary" --data-binary '{"model":"tiny","prompt":[1,2,999999]}' "$base/v1/completions"
status 400 "prompt past the context" --data-binary '{"model":"tiny","prompt":"x","max_tokens":99999999}' "$base/v1/completions"
status 404 "unknown model" --data-binary '{"model":"gpt-9","prompt":"x"}' "$base/v1/completions"
status 200 "models" "$base/v1/models"

# A shared prefix: after the first request, the others hit the cache (the router sends them to the
# engine holding it), sent back to back: before that engine's KV events reach the router, the
# first one's blocks count as pending there.
long=$(python3 -c "print('the shared system prompt of this conversation ' * 40)")
cached=()
for i in 1 2 3 4 5; do
    c=$(curl -s "$base/v1/completions" -H content-type:application/json \
        -d "{\"model\":\"tiny\",\"prompt\":\"$long question $i\",\"max_tokens\":2}" |
        node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).usage.prompt_tokens_details.cached_tokens))')
    cached+=("$c")
done
hits=0; for c in "${cached[@]:1}"; do [[ $c -gt 0 ]] && hits=$((hits + 1)); done
[[ $hits -eq 4 ]] && ok "router: shared prefix served from cache (cached tokens ${cached[*]})" ||
    bad "router: shared prefix" "cached tokens ${cached[*]}"

# Kill the engine running a long stream: the stream ends with the error, the next requests work.
curl -sN "$base/v1/completions" -H content-type:application/json \
    -d '{"model":"tiny","prompt":"a long story","max_tokens":3000,"ignore_eos":true,"stream":true}' > "$work/stream.out" &
curl_pid=$!
victim=
for _ in $(seq 50); do
    sleep 0.1
    curl -s "$base/metrics" > "$work/metrics"
    victim=$(sed -n 's/^fanout_rank_running_sequences{[^}]*rank="\([0-9]\)"} 1$/\1/p' "$work/metrics" | head -1)
    [[ -n $victim ]] && break
done
if [[ -n $victim ]]; then
    kill -9 "${engine_pid[$victim]}"
    wait "$curl_pid"
    grep -q '"code":"service_unavailable"' "$work/stream.out" &&
        ok "router: the killed engine's stream ends with the 503-style error" ||
        bad "router: killed stream" "$(tail -c 300 "$work/stream.out")"
    good=0
    for i in 1 2 3 4 5 6 7 8; do
        code=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -H content-type:application/json \
            -d "{\"model\":\"tiny\",\"prompt\":\"after $i\",\"max_tokens\":3}")
        [[ $code == 200 ]] && good=$((good + 1))
    done
    [[ $good -eq 8 ]] && ok "router: 8 requests after the kill all succeed" || bad "router: after the kill" "$good/8 ok"
    grep -q "out of rotation" "$work/router.log" && ok "router: the engine left the rotation" ||
        bad "router: rotation" "$(tail -3 "$work/router.log")"
    start_engine "$victim" "${engine_port[$victim]}"
    rejoined=0
    for _ in $(seq 100); do
        [[ $(grep -c "127.0.0.1:${engine_port[$victim]} is healthy" "$work/router.log") -ge 2 ]] && { rejoined=1; break; }
        sleep 0.1
    done
    [[ $rejoined -eq 1 ]] && ok "router: the restarted engine rejoined" || bad "router: rejoin" "$(tail -3 "$work/router.log")"
else
    kill "$curl_pid" 2>/dev/null
    bad "router: find the engine running the stream" "$(grep rank_running "$work/metrics")"
fi

# SIGTERM drains: the stream in flight finishes, a new request meanwhile gets 503, the router exits 0.
curl -sN "$base/v1/completions" -H content-type:application/json \
    -d '{"model":"tiny","prompt":"one more story","max_tokens":120,"ignore_eos":true,"stream":true}' > "$work/drain.out" &
curl_pid=$!
sleep 0.3
kill -TERM "$router_pid"
sleep 0.2
late=$(curl -s -o /dev/null -w '%{http_code}' "$base/v1/completions" -H content-type:application/json \
    -d '{"model":"tiny","prompt":"too late","max_tokens":2}')
wait "$curl_pid"
wait "$router_pid"
rc=$?
grep -q "data: \[DONE\]" "$work/drain.out" && ok "router: SIGTERM lets the stream in flight finish" ||
    bad "router: drain" "$(tail -c 200 "$work/drain.out")"
[[ $late == 503 || $late == 000 ]] && ok "router: a request during the drain is refused ($late)" ||
    bad "router: request during the drain" "status $late"
[[ $rc -eq 0 ]] && grep -q "fanout router: stopped" "$work/router.log" && ok "router: SIGTERM stops it (exit 0)" ||
    bad "router: SIGTERM" "exit $rc"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
