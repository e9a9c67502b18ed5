#!/usr/bin/env bash
# `fanout serve --model tiny` end to end: the official openai npm client (serve_client.mjs), curl
# for malformed requests, and a greedy completion equal to `fanout generate`.
# Usage: serve_test.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/e2e/common.sh"

start_server serve --model tiny --max-in-flight 400
[[ -n $port ]] || { echo "FAIL server did not start: $(cat "$work/serve.log")"; echo "0 passed, 1 failed"; exit 1; }
base=http://127.0.0.1:$port

# status CODE NAME [curl args...]: the response status, and an OpenAI-shaped error body for 4xx.
status() {
    local want=$1 name=$2; shift 2
    local got
    got=$(curl -s -o "$work/body" -w '%{http_code}' -H content-type:application/json "$@")
    if [[ $got == "$want" ]] && { [[ $want == 2* ]] || grep -q '"error"' "$work/body"; }; then ok "$name ($got)";
    else bad "$name" "status $got, body $(head -c 300 "$work/body")"; fi
}
post() { echo "-H content-type:application/json --data-binary $1 $base$2"; }
status 200 "health" "$base/health"
status 200 "models" "$base/v1/models"
status 400 "invalid JSON" -H content-type:application/json --data-binary '{bad' "$base/v1/chat/completions"
status 400 "body not an object" --data-binary '[1,2]' "$base/v1/chat/completions"
status 400 "missing messages" --data-binary '{"model":"tiny"}' "$base/v1/chat/completions"
status 400 "unknown field" --data-binary '{"model":"tiny","messages":[{"role":"user","content":"x"}],"bogus":1}' "$base/v1/chat/completions"
status 400 "wrong type" --data-binary '{"model":"tiny","messages":[{"role":"user","content":"x"}],"max_tokens":"ten"}' "$base/v1/chat/completions"
status 400 "bad role" --data-binary '{"model":"tiny","messages":[{"role":"robot","content":"x"}]}' "$base/v1/chat/completions"
status 404 "unknown model" --data-binary '{"model":"gpt-9","prompt":"x"}' "$base/v1/completions"
status 400 "prompt past the context" --data-binary '{"model":"tiny","prompt":"x","max_tokens":99999999}' "$base/v1/completions"
status 400 "token id past the vocabulary" --data-binary '{"model":"tiny","prompt":[1,2,999999]}' "$base/v1/completions"
printf '{"model":"tiny","prompt":"a\xff\xfeb"}' > "$work/bad_utf8.json"
status 400 "invalid UTF-8" --data-binary @"$work/bad_utf8.json" "$base/v1/completions"
head -c 9000000 /dev/zero | tr '\0' 'a' > "$work/big.json"
status 413 "oversized body" --data-binary @"$work/big.json" "$base/v1/completions"
status 400 "max_tokens past int64 arithmetic" --data-binary '{"model":"tiny","prompt":"x","max_tokens":9223372036854775807}' "$base/v1/completions"
status 400 "response_format.type not a string" --data-binary '{"model":"tiny","messages":[{"role":"user","content":"x"}],"response_format":{"type":5}}' "$base/v1/chat/completions"
status 400 "content part type not a string" --data-binary '{"model":"tiny","messages":[{"role":"user","content":[{"type":1,"text":"x"}]}]}' "$base/v1/chat/completions"
status 200 "content as text parts" --data-binary '{"model":"tiny","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"max_tokens":2}' "$base/v1/chat/completions"
status 400 "n > 1" --data-binary '{"model":"tiny","prompt":"x","n":2}' "$base/v1/completions"
status 404 "unknown route" "$base/v2/nothing"
grep -q 'fanout_time_to_first_token_seconds_bucket' <(curl -s "$base/metrics") && ok "metrics" || bad "metrics" "no TTFT histogram"

# A greedy completion equals `fanout generate` (same prompt, BOS added both ways).
want=$("$fanout" generate --model tiny --prompt "The capital of France is" --max-tokens 10 --ignore-eos 2>/dev/null)
got=$(curl -s "$base/v1/completions" -H content-type:application/json \
    --data-binary '{"model":"tiny","prompt":"The capital of France is","max_tokens":10,"temperature":0,"ignore_eos":true}' |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).choices[0].text))')
[[ -n $want && $got == "$want" ]] && ok "greedy completion equals fanout generate" || bad "greedy == generate" "'$got' vs '$want'"

node "$root/tests/e2e/serve_client.mjs" "$base" > "$work/client.log" 2>&1
client_rc=$?
cat "$work/client.log"
passed=$((passed + $(grep -c '^PASS' "$work/client.log")))
failed=$((failed + $(grep -c '^FAIL' "$work/client.log")))
[[ $client_rc -eq 0 ]] || grep -q '^FAIL' "$work/client.log" || { bad "openai client" "exit $client_rc"; }

# The FP8 KV cache through the engine: the same 1 GB holds more blocks than the f32 cache's (100
# bytes per entry against 320 at the tiny model's widths), and a greedy completion equals
# `fanout generate --kv-dtype fp8`.
blocks_f32=$(sed -n 's/.*model .tiny., \([0-9]*\) KV blocks.*/\1/p' "$work/serve.log")
start_server serve_fp8 --model tiny --kv-dtype fp8
blocks_fp8=$(sed -n 's/.*model .tiny., \([0-9]*\) KV blocks.*/\1/p' "$work/serve_fp8.log")
if [[ -n $port && -n $blocks_f32 && -n $blocks_fp8 ]] && ((blocks_fp8 * 10 >= blocks_f32 * 31)); then
    ok "--kv-dtype fp8 holds 3.2x the f32 cache's blocks ($blocks_fp8 vs $blocks_f32)"
else bad "--kv-dtype fp8 blocks" "'$blocks_fp8' vs '$blocks_f32': $(tail -2 "$work/serve_fp8.log")"; fi
want=$("$fanout" generate --model tiny --prompt "The capital of France is" --max-tokens 10 --ignore-eos --kv-dtype fp8 2>/dev/null)
got=$(curl -s "http://127.0.0.1:$port/v1/completions" -H content-type:application/json \
    --data-binary '{"model":"tiny","prompt":"The capital of France is","max_tokens":10,"temperature":0,"ignore_eos":true}' |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>process.stdout.write(JSON.parse(s).choices[0].text))')
[[ -n $want && $got == "$want" ]] && ok "fp8 KV cache: greedy completion equals fanout generate" || bad "fp8 greedy == generate" "'$got' vs '$want'"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
