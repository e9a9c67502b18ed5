#!/usr/bin/env bash
# `fanout serve --ep N` (data-parallel / expert-parallel ranks in lockstep, CPU path) end to end, in
# three deployments:
#   threads    fanout serve --model tiny --ep 4                      (ranks are threads)
#   tp         ... --ep 4 --tp 2 --microbatch on --mtp 1             (2 DP ranks of 2 TP ranks, threads)
#   mpirun     mpirun -np 4 ... fanout serve --model tiny            (one process per rank, launcher's world)
#   mpirun_tp  mpirun -np 4 ... fanout serve --model tiny --tp 2 --mtp 1 (2 DP ranks of 2 TP processes)
#   processes  fanout serve --model tiny --ep 2 --ranks processes    (fanout execs mpirun on itself)
# For each: 64 concurrent requests through the official openai client (serve_ep_client.mjs: chat and
# completions, streamed and not, max_tokens 1..24 so ranks go idle at different times) all finish with
# every token; greedy completions sent at once (so they land on different ranks) equal the single-rank
# `fanout generate`; /metrics sums the ranks (requests received and finished, tokens generated);
# SIGTERM to the pid we started ends every process of the group within 10 s with exit status 0 and
# each rank saying it stopped, leaving no process behind (mpirun: see below). Idle servers (threads,
# mpirun) must use ~no CPU. The MPI deployments are skipped (SKIP, not PASS) when mpirun is not on PATH.
# Usage: serve_ep_test.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work" && mkdir -p "$work"
source "$root/tests/e2e/common.sh"
if [[ $EUID -eq 0 ]]; then  # OpenMPI refuses root unless told twice (ctest sets these too)
    export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
fi
serve_args=(--model tiny --kv-memory-gb 0.2 --max-in-flight 400)

# Every process of a deployment carries FANOUT_E2E_TAG=<tag> in its environment (mpirun passes it to
# the ranks), so that what is left of a group can be found without matching other fanouts.
tag_base="serve_ep_$$"
tagged() {  # tagged TAG: the live processes carrying it (zombies have no environment left)
    local p
    for p in /proc/[0-9]*; do
        grep -qsxz "FANOUT_E2E_TAG=$1" "$p/environ" && echo "${p#/proc/}"
    done
}
kill_tagged() { local p; for p in $(tagged "$1"); do kill -9 "$p" 2>/dev/null; done; }
cleanup() {
    stop_servers
    for name in threads tp mpirun mpirun_tp mpirun_rank0 processes; do kill_tagged "${tag_base}_$name"; done
}
trap cleanup EXIT

# launch NAME CMD...: CMD (which ends in `serve ... --port 0`) in the background, tagged, stderr in
# $work/NAME.log; sets $pid and $port (empty when it did not start within 60 s).
launch() {
    local name=$1; shift
    FANOUT_E2E_TAG="${tag_base}_$name" "$@" > "$work/$name.out" 2> "$work/$name.log" &
    pid=$!
    servers+=("$pid")
    port=
    for _ in $(seq 300); do
        port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/$name.log" 2>/dev/null)
        [[ -n $port ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
}

metric() { sed -n "s/^$1{[^}]*} \([0-9.e+]*\)\$/\1/p" "$work/metrics"; }

# The single-rank reference: `fanout generate` (stdout is the text and one newline).
prompts=("The capital of France is" "Once upon a time" "def fibonacci(n):" "1, 2, 3, 4," "Le chat est"
         "Water boils at" "In 1969 the first" "The quick brown fox")
for i in "${!prompts[@]}"; do
    "$fanout" generate --model tiny --prompt "${prompts[$i]}" --max-tokens 10 --ignore-eos > "$work/gen$i.txt" 2> "$work/gen$i.log" ||
        bad "fanout generate '${prompts[$i]}'" "exit $?: $(tail -3 "$work/gen$i.log")"
done
node -e '
  const fs = require("fs");
  const [dir, ...prompts] = process.argv.slice(1);
  const out = prompts.map((prompt, i) => ({ prompt, text: fs.readFileSync(`${dir}/gen${i}.txt`, "utf8").replace(/\n$/, "") }));
  fs.writeFileSync(`${dir}/expected.json`, JSON.stringify(out, null, 1));' "$work" "${prompts[@]}"

# check_load NAME: the openai client's load and greedy checks, then /metrics against what it sent.
check_load() {
    local name=$1 base=http://127.0.0.1:$port
    node "$root/tests/e2e/serve_ep_client.mjs" "$base" "$work/expected.json" > "$work/$name.client.log" 2>&1
    local rc=$?
    sed -n 's/^\(PASS\|FAIL\) /\1 '"$name"': /p' "$work/$name.client.log"
    passed=$((passed + $(grep -c '^PASS' "$work/$name.client.log")))
    failed=$((failed + $(grep -c '^FAIL' "$work/$name.client.log")))
    [[ $rc -eq 0 ]] || grep -q '^FAIL' "$work/$name.client.log" || bad "$name: openai client" "exit $rc: $(tail -5 "$work/$name.client.log")"
    local sent tokens received finished generated
    sent=$(sed -n 's/^SENT //p' "$work/$name.client.log")
    tokens=$(sed -n 's/^TOKENS //p' "$work/$name.client.log")
    [[ -n $sent ]] || return
    for _ in $(seq 20); do  # the last events may still be on their way from the ranks
        curl -s "$base/metrics" > "$work/metrics"
        received=$(metric fanout_requests_received_total)
        finished=$(metric fanout_requests_finished_total)
        generated=$(metric fanout_generation_tokens_total)
        [[ $received == "$sent" && $finished == "$sent" && $generated == "$tokens" ]] && break
        sleep 0.1
    done
    [[ $received == "$sent" ]] && ok "$name: /metrics counts the $sent requests received over all ranks" ||
        bad "$name: /metrics requests received" "fanout_requests_received_total=$received, sent $sent"
    [[ $finished == "$sent" && $generated == "$tokens" ]] &&
        ok "$name: /metrics counts them finished, with their $tokens tokens" ||
        bad "$name: /metrics requests finished / tokens" "finished=$finished generated=$generated, want $sent / $tokens"
    # Per rank: the least-loaded hand-off gave every rank some of the requests, and the ranks' counts
    # add up to the total.
    local per_rank sum=0 idle=0 n=0
    per_rank=$(sed -n 's/^fanout_rank_requests_received_total{[^}]*} \([0-9]*\)$/\1/p' "$work/metrics")
    for v in $per_rank; do sum=$((sum + v)); n=$((n + 1)); [[ $v -gt 0 ]] || idle=$((idle + 1)); done
    [[ $n -ge 2 && $idle -eq 0 && $sum == "$sent" ]] &&
        ok "$name: every one of the $n ranks took requests ($(echo $per_rank | tr ' ' '/'))" ||
        bad "$name: per-rank requests" "ranks: '$(echo $per_rank)', sum $sum of $sent"
}

# stop_group NAME RANKS WANT_RC [PID_TO_SIGNAL]: SIGTERM (to $pid unless told otherwise); the group
# must be gone within 10 s with exit status WANT_RC ('' = report it, do not judge), rank 0 saying
# "fanout serve: stopped" and every rank R > 0 "fanout serve: rank R stopped" (MPI deployments).
stop_group() {
    local name=$1 ranks=$2 want_rc=$3 target=${4:-$pid} tag="${tag_base}_$1" t0 left r rc missing=
    t0=$(date +%s%N)
    kill -TERM "$target"
    for _ in $(seq 100); do
        left=$(tagged "$tag")
        [[ -z $left ]] && break
        sleep 0.1
    done
    local took=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [[ -n $left ]]; then
        bad "$name: SIGTERM ends every process within 10 s" "left after ${took} ms: $(ps -o pid=,stat=,args= -p "${left//$'\n'/,}" | head -8)"
        kill_tagged "$tag"
    else
        ok "$name: SIGTERM ends every process of the group within 10 s (${took} ms), none left behind"
    fi
    wait "$pid"
    rc=$?
    local keep=() s
    for s in "${servers[@]}"; do [[ $s == "$pid" ]] || keep+=("$s"); done
    servers=("${keep[@]}")
    grep -q '^fanout serve: stopped$' "$work/$name.log" || missing+=" rank 0"
    for ((r = 1; r < ranks; r++)); do
        grep -q "^fanout serve: rank $r stopped\$" "$work/$name.log" || missing+=" rank $r"
    done
    [[ -z $missing ]] && ok "$name: every rank says it stopped" || bad "$name: stop lines" "missing for$missing: $(tail -5 "$work/$name.log")"
    if [[ -z $want_rc ]]; then
        echo "NOTE $name: exit status $rc"
    elif [[ $rc == "$want_rc" ]]; then
        ok "$name: exit status $rc"
    else
        bad "$name: exit status" "$rc, want $want_rc; log: $(tail -5 "$work/$name.log" | tr '\n' '|')"
    fi
}

# cpu_ticks PID...: their user + system time in clock ticks.
cpu_ticks() { local p s=0; for p in "$@"; do s=$((s + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done; echo $s; }
# idle_check NAME PERCENT PID...: with no requests, the processes together use under PERCENT of one
# core over 3 s (ranks wait for work; they do not spin).
idle_check() {
    local name=$1 percent=$2 hz t0 used; shift 2
    sleep 1
    hz=$(getconf CLK_TCK) t0=$(cpu_ticks "$@")
    sleep 3
    used=$(( $(cpu_ticks "$@") - t0 ))
    (( used * 100 < hz * 3 * percent )) && ok "$name: an idle server uses ~no CPU ($used ticks of $hz/s in 3 s)" ||
        bad "$name: idle CPU" "$used ticks ($hz/s) in 3 s over $# processes, want under $percent% of a core"
}

started() {  # started NAME: whether the last launch listened; says why not
    if [[ -n $port ]]; then return 0; fi
    bad "$1: server did not start" "$(tail -20 "$work/$1.log")"
    kill_tagged "${tag_base}_$1"
    return 1
}

# (a) ranks as threads.
launch threads "$fanout" serve --port 0 "${serve_args[@]}" --ep 4
if started threads; then
    grep -q '4 DP/EP ranks as threads' "$work/threads.log" && ok "threads: 4 ranks as threads" ||
        bad "threads: start-up line" "$(grep listening "$work/threads.log")"
    check_load threads
    idle_check threads 15 "$pid"
    stop_group threads 1 0
fi

# (a2) the same 4 ranks as two DP ranks of TP groups of two (tensor-parallel attention), every step
# as two microbatches and with one MTP draft: the same greedy completions and counts.
launch tp "$fanout" serve --port 0 "${serve_args[@]}" --ep 4 --tp 2 --microbatch on --mtp 1
if started tp; then
    check_load tp
    curl -s "http://127.0.0.1:$port/metrics" > "$work/metrics"
    steps=$(metric fanout_engine_steps_total) mb=$(metric fanout_engine_microbatch_steps_total)
    [[ -n $steps && $steps == "$mb" && $steps != 0 ]] && ok "tp: every one of the $steps steps ran as two microbatches" ||
        bad "tp: microbatch steps" "steps $steps, microbatched $mb"
    stop_group tp 1 0
fi

if ! command -v mpirun > /dev/null; then
    echo "SKIP mpirun and processes deployments: mpirun is not on PATH (install OpenMPI)"
else
    mpirun=(mpirun -np 4 --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)

    # (b) ranks as processes under a launcher; SIGTERM to mpirun. NOTE: OpenMPI's mpirun exits 1
    # whenever it is signalled (ORTE's clean_abort sets a non-zero status by design), however its
    # processes end, so here the stop lines and the empty process table prove a clean stop ...
    launch mpirun "${mpirun[@]}" "$fanout" serve --port 0 "${serve_args[@]}"
    if started mpirun; then
        grep -q '4 DP/EP ranks as processes' "$work/mpirun.log" && ok "mpirun: 4 ranks as processes" ||
            bad "mpirun: start-up line" "$(grep listening "$work/mpirun.log")"
        check_load mpirun
        idle_check mpirun 50 $(tagged "${tag_base}_mpirun")
        stop_group mpirun 4 ""
    fi
    # (b2) TP groups as processes: ranks 0 and 2 are the DP ranks (engines), 1 and 3 their TP
    # followers, which every step reaches through their group's channel.
    launch mpirun_tp "${mpirun[@]}" "$fanout" serve --port 0 "${serve_args[@]}" --tp 2 --mtp 1
    if started mpirun_tp; then
        check_load mpirun_tp
        stop_group mpirun_tp 4 ""
    fi
    # ... and SIGTERM to rank 0's process (it stops the group) shows every rank exiting 0: mpirun's
    # status is 0 only when all of its processes' are.
    launch mpirun_rank0 "${mpirun[@]}" "$fanout" serve --port 0 "${serve_args[@]}"
    if started mpirun_rank0; then
        rank0=
        for p in $(tagged "${tag_base}_mpirun_rank0"); do
            grep -qsxz 'OMPI_COMM_WORLD_RANK=0' "/proc/$p/environ" && rank0=$p
        done
        curl -s -o /dev/null -H content-type:application/json "http://127.0.0.1:$port/v1/completions" \
            --data-binary '{"model":"tiny","prompt":"x","max_tokens":3,"ignore_eos":true}'
        if [[ -n $rank0 ]]; then stop_group mpirun_rank0 4 0 "$rank0";
        else bad "mpirun_rank0: rank 0's process" "none carries OMPI_COMM_WORLD_RANK=0"; fi
    fi

    # (c) fanout starts mpirun itself (exec: the pid we started becomes mpirun's); fanout owns this
    # command's exit status, so a SIGTERM must end it with 0.
    launch processes "$fanout" serve --port 0 "${serve_args[@]}" --ep 2 --ranks processes
    if started processes; then
        grep -q '2 DP/EP ranks as processes' "$work/processes.log" && ok "processes: 2 ranks as processes" ||
            bad "processes: start-up line" "$(grep listening "$work/processes.log")"
        check_load processes
        stop_group processes 2 0
    fi
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
