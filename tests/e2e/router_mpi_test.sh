#!/usr/bin/env bash
# One mpirun starts the router and the engines behind it (MPMD: `-np 1 fanout router ... : -np 4
# fanout engine --ep 2 ...`): the 4 engine processes form 2 engines of 2 DP/EP ranks each, every
# engine tells the router where it listens (no --engine), requests stream through, a shared prefix
# is served from cache (the router's index holds each 2-rank engine's union of cached blocks, and
# that engine's rank 0 places the request on the rank holding them), and SIGTERM to the launch's
# processes stops everything with exit status 0. A second router in the launch, or `fanout serve` behind one, is
# refused with an error naming it.
# Usage: router_mpi_test.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/e2e/common.sh"
command -v mpirun >/dev/null || { echo "FAIL mpirun: not installed (scripts/install_deps.sh installs OpenMPI)"; exit 1; }
mpi=(mpirun --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

"${mpi[@]}" -np 1 "$fanout" router --model tiny --port 0 : \
    -np 4 "$fanout" engine --model tiny --ep 2 --port 0 --kv-memory-gb 0.2 --threads 1 > "$work/launch.log" 2>&1 &
launch=$!
servers+=("$launch")
port=
for _ in $(seq 600); do
    port=$(sed -n 's/.*fanout router: listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/launch.log")
    [[ -n $port ]] && break
    kill -0 "$launch" 2>/dev/null || break
    sleep 0.2
done
[[ -n $port ]] || { bad "launch" "$(tail -20 "$work/launch.log")"; echo "$passed passed, $failed failed"; exit 1; }
base=http://127.0.0.1:$port
n=$(grep -c "(from the launcher)" "$work/launch.log")
[[ $n -eq 2 ]] && ok "the router found the launch's 2 engines" || bad "discovery" "$n engines: $(grep router "$work/launch.log")"
grep -q "2 of 2 engines healthy" "$work/launch.log" && ok "both engines healthy" || bad "health" "$(grep router "$work/launch.log")"

body=$(curl -s "$base/v1/chat/completions" -H content-type:application/json \
    -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}')
[[ $(grep -c '^data: {' <<<"$body") -ge 2 && $body == *"data: [DONE]"* ]] && ok "streamed chat through the launch" ||
    bad "stream" "${body:0:300}"

# A shared prefix of a few KV blocks: after the first request, the next ones are served from cache
# — though a long request keeps the engine holding it busy (idle engines tie: both go to engine 0),
# so only the router's index of that engine's cache (the union of its ranks') sends them there.
long=$(python3 -c "print('the shared system prompt of this conversation ' * 40)")
cached=()
for i in 1 2 3 4; do
    if [[ $i == 2 ]]; then
        curl -s -N "$base/v1/completions" -H content-type:application/json \
            -d '{"model":"tiny","prompt":"busy","max_tokens":5000,"stream":true,"ignore_eos":true}' > /dev/null &
        busy=$!
        sleep 1
    fi
    c=$(curl -s "$base/v1/completions" -H content-type:application/json \
        -d "{\"model\":\"tiny\",\"prompt\":\"$long question $i\",\"max_tokens\":2}" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])')
    cached+=("$c")
done
kill "$busy" 2>/dev/null
grep -q "engine 1 of 2 in this launch" "$work/launch.log" && ok "engine processes split into 2 engines of 2 ranks" ||
    bad "split" "$(grep 'serving grpc' "$work/launch.log")"
if [[ ${cached[0]} == 0 && ${cached[1]} -ge 128 && ${cached[2]} -ge 128 && ${cached[3]} -ge 128 ]]; then
    ok "shared prefix served from cache across DP engines (cached tokens ${cached[*]})"
else
    bad "prefix" "cached tokens ${cached[*]}"
fi

# SIGTERM to the launch's processes (as a terminal's Ctrl-C to the process group, or the batch
# system, delivers it; mpirun itself, signalled, ends the job as failed): the router drains, the
# engines stop their ranks, mpirun exits 0.
pkill -TERM -P "$launch"
rc=0
for _ in $(seq 300); do kill -0 "$launch" 2>/dev/null || break; sleep 0.1; done
wait "$launch"; rc=$?
servers=()
[[ $rc -eq 0 ]] && ok "SIGTERM: the launch stopped, exit 0" || bad "SIGTERM" "exit $rc: $(tail -5 "$work/launch.log")"
[[ $(grep -c "fanout engine: stopped" "$work/launch.log") -eq 2 && $(grep -c "fanout router: stopped" "$work/launch.log") -eq 1 ]] &&
    ok "router and both engines stopped cleanly" || bad "stop" "$(tail -8 "$work/launch.log")"

# Two routers in one launch; `fanout serve` behind a router.
timeout 120 "${mpi[@]}" -np 2 "$fanout" router --model tiny > "$work/two.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && grep -q "more than one fanout router" "$work/two.log" && ok "two routers refused" ||
    bad "two routers" "exit $rc: $(tail -3 "$work/two.log")"
timeout 120 "${mpi[@]}" -np 1 "$fanout" router --model tiny : -np 1 "$fanout" serve --model tiny > "$work/serve.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && grep -q "start the engines behind it with \`fanout engine\`" "$work/serve.log" &&
    ok "fanout serve behind a router refused" || bad "serve behind router" "exit $rc: $(tail -3 "$work/serve.log")"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
