#!/usr/bin/env bash
# `fanout serve --model tiny` against a hostile client: every finding of the security review and its
# family (adversarial.mjs: deep JSON, body limits and framing, slow clients, stalls, Host and
# Content-Type checks, silently accepted fields, small HTTP details), plus what only a process can
# show: a served model name that would inject /metrics lines refuses to start, and `fanout tokenize
# --chat` on a deeply nested line is an error, not a crash.
# Usage: adversarial_test.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/e2e/common.sh"
t_start=$SECONDS

# 1,100 slow clients need as many descriptors (the server raises its own limit up to the hard one).
if [[ $(ulimit -n) != unlimited && $(ulimit -n) -lt 4096 ]]; then
    ulimit -n 4096 2>/dev/null || echo "WARN ulimit -n is $(ulimit -n) and cannot be raised to 4096 (hard limit $(ulimit -Hn))"
fi

start_server main --model tiny --default-max-tokens 8
[[ -n $port ]] || { echo "FAIL server did not start: $(cat "$work/main.log")"; echo "0 passed, 1 failed"; exit 1; }
main_pid=$pid main_port=$port

# A model folder given with a trailing slash (its files linked from the cached tiny model), also
# accepting Host: attacker.example.
tiny_dir=$(ls -d "${FANOUT_CACHE:-$HOME/.cache/fanout}"/tiny-* 2>/dev/null | head -1)
alt_port=
if [[ -n $tiny_dir && -f $tiny_dir/config.json ]]; then
    mkdir -p "$work/my-tiny-model"
    for f in "$tiny_dir"/*; do ln -s "$f" "$work/my-tiny-model/"; done
    start_server alt --model "$work/my-tiny-model/" --allowed-hosts attacker.example --kv-memory-gb 0.1
    alt_port=$port
    [[ -n $alt_port ]] || bad "server with --model DIR/ and --allowed-hosts" "did not start: $(tail -3 "$work/alt.log")"
else
    bad "the cached tiny model" "no tiny-* folder under ${FANOUT_CACHE:-$HOME/.cache/fanout}"
fi

# A served model name with a quote and a brace: /metrics must escape it.
evil_name='evil"} 1'
start_server evil --model tiny --served-model-name "$evil_name" --kv-memory-gb 0.1
evil_port=$port
[[ -n $evil_port ]] || bad "server with --served-model-name '$evil_name'" "did not start: $(tail -3 "$work/evil.log")"

# Names that would add lines to /metrics (or the log) are refused at start: exit 2 and an error.
for name in $'a\nb' $'a\rb' $'a\tb'; do
    shown=$(printf '%q' "$name")
    timeout 20 "$fanout" serve --model tiny --port 0 --served-model-name "$name" > /dev/null 2> "$work/badname.log"
    rc=$?
    if [[ $rc -eq 2 ]] && grep -q 'error:.*control character' "$work/badname.log"; then ok "--served-model-name $shown refused (exit 2)";
    else bad "--served-model-name $shown" "expected exit 2 and 'error: ... control character' on stderr; got exit $rc: $(tail -2 "$work/badname.log")"; fi
done

# `fanout tokenize --chat` on a line nested 100,000 deep: exit 2 with an error, not a signal.
node -e '
const n = 100000, deep = "[".repeat(n) + "]".repeat(n);
require("fs").writeFileSync(process.argv[1],
    `[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":${deep}}}]},{"role":"user","content":"x"}]\n` +
    `[{"role":"user","content":${deep}}]\n`);' "$work/deep.jsonl"
for line in 1 2; do
    sed -n "${line}p" "$work/deep.jsonl" | timeout 60 "$fanout" tokenize --model tiny --chat > /dev/null 2> "$work/tokenize.err"
    rc=$?
    if [[ $rc -eq 2 ]] && grep -q '^error:' "$work/tokenize.err"; then ok "tokenize --chat on 100,000-deep messages (line $line): exit 2, error on stderr";
    else bad "tokenize --chat on 100,000-deep messages (line $line)" "expected exit 2 and 'error:' on stderr; got exit $rc$( ((rc > 128)) && echo " (signal $((rc - 128)))"): $(head -c 300 "$work/tokenize.err")"; fi
done

# A token and its text for the logit_bias case; the greedy first token after [0, 1000, 2000, 3000].
token_id=$(echo '"hello"' | "$fanout" tokenize --model tiny --jsonl --no-special-tokens 2>/dev/null | tr -d '[]')
token_text=hello
[[ $token_id =~ ^[0-9]+$ ]] || { bad "tokenize 'hello'" "expected one token id, got '$token_id'"; token_id=; }
greedy_id=$("$fanout" generate --model tiny --prompt-ids 0,1000,2000,3000 --max-tokens 1 --ignore-eos 2>/dev/null)
[[ $greedy_id =~ ^[0-9]+$ ]] || { bad "generate one greedy token" "got '$greedy_id'"; greedy_id=; }

ADV_SERVER_PID=$main_pid ADV_DEFAULT_MAX_TOKENS=8 \
ADV_ALT_BASE=${alt_port:+http://127.0.0.1:$alt_port} ADV_ALT_NAME=my-tiny-model \
ADV_EVIL_BASE=${evil_port:+http://127.0.0.1:$evil_port} ADV_EVIL_NAME=$evil_name \
ADV_TOKEN_ID=$token_id ADV_TOKEN_TEXT=$token_text ADV_GREEDY_ID=$greedy_id \
    node "$root/tests/e2e/adversarial.mjs" "http://127.0.0.1:$main_port" > "$work/client.log" 2>&1
client_rc=$?
cat "$work/client.log"
passed=$((passed + $(grep -c '^PASS' "$work/client.log")))
failed=$((failed + $(grep -c '^FAIL' "$work/client.log")))
[[ $client_rc -eq 0 ]] || grep -q '^FAIL' "$work/client.log" || bad "adversarial.mjs" "exit $client_rc"

# Every server survived all of it.
for p in $main_pid; do kill -0 "$p" 2>/dev/null || bad "main server alive at the end" "it exited: $(tail -5 "$work/main.log")"; done
echo "adversarial suite: $((SECONDS - t_start)) s"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
