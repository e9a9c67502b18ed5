# Shared by the e2e scripts (sourced): pass/fail counting and starting `fanout serve` on a free port.
# The sourcing script sets $fanout and $work first.
passed=0 failed=0
ok() { echo "PASS $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

servers=()
stop_servers() {
    for pid in "${servers[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${servers[@]}"; do wait "$pid" 2>/dev/null; done
}
trap stop_servers EXIT

# start_server NAME ARGS...: `fanout serve --port 0 ARGS` with its log in $work/NAME.log; sets $port
# (empty when it did not start) and $pid.
start_server() {
    local name=$1; shift
    "$fanout" serve --port 0 "$@" 2> "$work/$name.log" &
    pid=$!
    servers+=("$pid")
    port=
    for _ in $(seq 150); do
        port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/$name.log" 2>/dev/null)
        [[ -n $port ]] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
}
