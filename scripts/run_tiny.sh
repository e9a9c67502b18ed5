#!/usr/bin/env bash
# The main job on the embedded default model: build, start `fanout serve --model tiny` (the model
# is made on the fly on first use), send it one chat request with curl and print the reply, then
# keep serving on http://127.0.0.1:${PORT:-8000} until Ctrl-C. With --once, stop after the request.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
port=${PORT:-8000}
log=$(mktemp)
"${BUILD_DIR:-build}/apps/fanout" serve --model tiny --port "$port" 2> >(tee "$log" >&2) &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 150); do grep -q "listening on" "$log" && break; sleep 0.2; done
grep -q "listening on" "$log" || { echo "the server did not start" >&2; exit 1; }
request='{"model": "tiny", "messages": [{"role": "user", "content": "Hello! Who are you?"}], "max_tokens": 24}'
echo "\$ curl http://127.0.0.1:$port/v1/chat/completions -d '$request'"
curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d "$request"
echo
echo "(the tiny model has random weights: the text is gibberish by design; the API is the real one)"
if [[ ${1:-} == --once ]]; then exit 0; fi
echo "serving on http://127.0.0.1:$port — try the OpenAI clients or curl; Ctrl-C stops"
wait $server
