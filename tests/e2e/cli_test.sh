#!/usr/bin/env bash
# End-to-end checks of the fanout CLI. Usage: cli_test.sh FANOUT_BINARY WORK_DIR
# Each check prints one line; the script ends with 'N passed, N failed' and exits non-zero on
# any failure.
set -u
fanout=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
passed=0 failed=0

ok() { echo "PASS $1"; passed=$((passed + 1)); }
bad() { echo "FAIL $1: $2"; failed=$((failed + 1)); }

# expect_ok NAME REGEX CMD...: exit 0 and stdout matching REGEX.
expect_ok() {
    local name=$1 regex=$2; shift 2
    local out
    if out=$("$@" 2>"$work/stderr"); then
        if [[ $out =~ $regex ]]; then ok "$name"; else bad "$name" "stdout '$out' does not match /$regex/"; fi
    else
        bad "$name" "exit $? ($(tail -1 "$work/stderr"))"
    fi
}

# expect_error NAME MESSAGE CMD...: exit 2 and MESSAGE on stderr.
expect_error() {
    local name=$1 msg=$2; shift 2
    "$@" >/dev/null 2>"$work/stderr"
    local rc=$?
    if [[ $rc -ne 2 && $rc -ne 106 && $rc -ne 105 && $rc -ne 109 ]]; then bad "$name" "exit $rc, expected an error exit"; return; fi
    if grep -qF -- "$msg" "$work/stderr"; then ok "$name"; else bad "$name" "stderr lacks '$msg': $(cat "$work/stderr")"; fi
}

ids16='^[0-9]+(,[0-9]+){15}$'

# A GPU flag's misuse is refused with its own message in a CUDA build; a CPU-only build
# (FANOUT_WITH_CUDA=OFF) refuses --device cuda itself first, naming that.
if "$fanout" generate --model tiny --device cuda --prompt-ids 1,2 --max-tokens 1 2>&1 >/dev/null |
    grep -qF "built without CUDA"; then
    gpu_flag_error() { echo "built without CUDA"; }
else
    gpu_flag_error() { echo "$1"; }
fi
expect_ok "generate on the embedded tiny model" "$ids16" \
    "$fanout" generate --model tiny --prompt-ids 0,100,200,300 --max-tokens 16 --ignore-eos
expect_ok "generate is deterministic when sampling with a seed" "$ids16" \
    "$fanout" generate --model tiny --prompt-ids 5,6,7 --max-tokens 16 --temperature 0.8 --top-p 0.9 --top-k 50 --seed 3 --ignore-eos
a=$("$fanout" generate --model tiny --prompt-ids 5,6,7 --max-tokens 8 --temperature 0.8 --seed 3 --ignore-eos 2>/dev/null)
b=$("$fanout" generate --model tiny --prompt-ids 5,6,7 --max-tokens 8 --temperature 0.8 --seed 3 --ignore-eos 2>/dev/null)
c=$("$fanout" generate --model tiny --prompt-ids 5,6,7 --max-tokens 8 --temperature 0.8 --seed 4 --ignore-eos 2>/dev/null)
[[ -n $a && $a == "$b" && $a != "$c" ]] && ok "same seed same tokens, other seed other tokens" || bad "seeded sampling" "$a | $b | $c"
# MTP speculative decoding: greedy output unchanged with 1 and 3 drafts, the acceptance reported.
plain=$("$fanout" generate --model tiny --prompt-ids 0,100,200,300 --max-tokens 16 --ignore-eos 2>/dev/null)
for k in 1 3; do
    spec=$("$fanout" generate --model tiny --prompt-ids 0,100,200,300 --max-tokens 16 --ignore-eos --mtp $k 2> "$work/mtp.err")
    [[ -n $plain && $spec == "$plain" ]] && grep -q "MTP: .* draft tokens accepted" "$work/mtp.err" &&
        ok "generate --mtp $k equals plain greedy" || bad "generate --mtp $k" "'$spec' vs '$plain' $(tail -2 "$work/mtp.err")"
done

# The GPU runner: on a GPU it generates; without one (CI) it says why, whichever way fanout was built.
if nvidia-smi -L >/dev/null 2>&1; then
    expect_ok "generate --device cuda on the embedded tiny model" "$ids16" \
        "$fanout" generate --model tiny --device cuda --prompt-ids 0,100,200,300 --max-tokens 16 --ignore-eos
else
    "$fanout" generate --model tiny --device cuda --prompt-ids 1,2 --max-tokens 2 >/dev/null 2>"$work/stderr"
    rc=$?
    if [[ $rc -eq 2 ]] && grep -qE "no CUDA device|built without CUDA" "$work/stderr"; then
        ok "generate --device cuda without a GPU is a clear error"
    else
        bad "generate --device cuda without a GPU" "exit $rc: $(cat "$work/stderr")"
    fi
    "$fanout" bench layer --batches 1,8 --eps 8 --json '' >/dev/null 2>"$work/stderr"
    rc=$?
    if [[ $rc -eq 2 ]] && grep -qE "needs a CUDA GPU|needs a CUDA build" "$work/stderr"; then
        ok "bench layer without a GPU is a clear error"
    else
        bad "bench layer without a GPU" "exit $rc: $(cat "$work/stderr")"
    fi
fi
"$fanout" score --model tiny --token-ids 1,2,3,4,5 --output "$work/logits.f32" 2>"$work/stderr"
size=$(stat -c %s "$work/logits.f32" 2>/dev/null || echo 0)
[[ $size -eq $((5 * 129280 * 4)) ]] && ok "score writes [T, vocab] float32" || bad "score" "size $size"
# Expert parallelism on the CPU path: 4 ranks (threads), each with 4 of the 16 routed experts; the
# logits equal EP1's within 1e-5.
"$fanout" score --model tiny --token-ids 1,2,3,4,5 --ep 4 --output "$work/logits_ep4.f32" 2>"$work/stderr"
# logits_close A B: "equal" when two [T, vocab] float32 files agree within 1e-5.
logits_close() {
    node -e '
const fs = require("fs");
const a = new Float32Array(fs.readFileSync(process.argv[1]).buffer.slice(0));
const b = new Float32Array(fs.readFileSync(process.argv[2]).buffer.slice(0));
let m = a.length === b.length ? 0 : Infinity;
for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
console.log(m <= 1e-5 ? "equal" : "max diff " + m);' "$1" "$2" 2>&1
}
diff_ep=$(logits_close "$work/logits.f32" "$work/logits_ep4.f32")
[[ $diff_ep == equal ]] && ok "score --ep 4 equals EP1 within 1e-5" || bad "score --ep 4" "$diff_ep $(tail -1 "$work/stderr")"
# generate --ep N runs the request on rank 0's engine of a DP group; the sampled tokens are EP1's.
ep1=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 2>/dev/null)
ep2=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --ep 2 2>/dev/null)
[[ -n $ep1 && $ep1 == "$ep2" ]] && ok "generate --ep 2 samples the same tokens as EP1" || bad "generate --ep 2" "'$ep2' vs '$ep1'"
ep4=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --ep 4 2>/dev/null)
[[ $ep1 == "$ep4" ]] && ok "generate --ep 4 samples the same tokens as EP1" || bad "generate --ep 4" "'$ep4' vs '$ep1'"
# The two-microbatch schedule: the same logits and tokens, at EP1 and EP4 (threads).
"$fanout" score --model tiny --token-ids 1,2,3,4,5 --ep 4 --microbatch on --output "$work/logits_mb4.f32" 2>"$work/stderr"
diff_mb=$(logits_close "$work/logits.f32" "$work/logits_mb4.f32")
[[ $diff_mb == equal ]] && ok "score --ep 4 --microbatch on equals EP1 within 1e-5" || bad "score --microbatch on" "$diff_mb $(tail -1 "$work/stderr")"
mb4=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --ep 4 --microbatch on 2>/dev/null)
[[ $ep1 == "$mb4" ]] && ok "generate --ep 4 --microbatch on samples the same tokens as EP1" || bad "generate --microbatch on" "'$mb4' vs '$ep1'"
mb1=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --microbatch auto --microbatch-min-tokens 4 2>/dev/null)
[[ $ep1 == "$mb1" ]] && ok "generate --microbatch auto (prefill microbatched) samples the same tokens" || bad "generate --microbatch auto" "'$mb1' vs '$ep1'"
# Tensor-parallel attention: EP4 as DP2 × TP2 (threads) — the logits and tokens of EP1.
"$fanout" score --model tiny --token-ids 1,2,3,4,5 --ep 4 --tp 2 --output "$work/logits_tp2.f32" 2>"$work/stderr"
diff_tp=$(logits_close "$work/logits.f32" "$work/logits_tp2.f32")
[[ $diff_tp == equal ]] && ok "score --ep 4 --tp 2 equals EP1 within 1e-5" || bad "score --tp 2" "$diff_tp $(tail -1 "$work/stderr")"
tp2=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --ep 4 --tp 2 2>/dev/null)
[[ $ep1 == "$tp2" ]] && ok "generate --ep 4 --tp 2 samples the same tokens as EP1" || bad "generate --tp 2" "'$tp2' vs '$ep1'"
expect_error "--tp that does not divide --ep" "--tp 3 must divide --ep 4" \
    "$fanout" generate --model tiny --prompt-ids 1,2 --ep 4 --tp 3
expect_error "--tp on the GPU" "$(gpu_flag_error 'tensor-parallel attention runs on the CPU path so far')" \
    "$fanout" score --model tiny --device cuda --token-ids 1,2 --ep 2 --tp 2 --output "$work/x.f32"
expect_error "--microbatch with a bad mode" "--microbatch: sometimes not in {on,off,auto}" \
    "$fanout" generate --model tiny --prompt-ids 1,2 --microbatch sometimes
# Ranks as processes: under mpirun (the world from the launcher), and self-launched.
if command -v mpirun >/dev/null; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    np4=(mpirun -np 4 --oversubscribe --bind-to none --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
    "${np4[@]}" "$fanout" score --model tiny --token-ids 1,2,3,4,5 --output "$work/logits_mpi4.f32" 2>"$work/stderr"
    diff_ep=$(logits_close "$work/logits.f32" "$work/logits_mpi4.f32")
    [[ $diff_ep == equal ]] && ok "mpirun -np 4 score equals EP1 within 1e-5" || bad "mpirun score" "$diff_ep $(tail -3 "$work/stderr")"
    mpi4=$("${np4[@]}" "$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 2>"$work/stderr")
    [[ $ep1 == "$mpi4" ]] && ok "mpirun -np 4 generate samples the same tokens as EP1" || bad "mpirun generate" "'$mpi4' vs '$ep1' $(tail -3 "$work/stderr")"
    mpimb=$("${np4[@]}" "$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --microbatch on 2>"$work/stderr")
    [[ $ep1 == "$mpimb" ]] && ok "mpirun -np 4 generate --microbatch on samples the same tokens as EP1" || bad "mpirun generate --microbatch on" "'$mpimb' vs '$ep1' $(tail -3 "$work/stderr")"
    "${np4[@]}" "$fanout" score --model tiny --token-ids 1,2,3,4,5 --microbatch on --output "$work/logits_mpimb.f32" 2>"$work/stderr"
    diff_ep=$(logits_close "$work/logits.f32" "$work/logits_mpimb.f32")
    [[ $diff_ep == equal ]] && ok "mpirun -np 4 score --microbatch on equals EP1 within 1e-5" || bad "mpirun score --microbatch on" "$diff_ep $(tail -3 "$work/stderr")"
    # Tensor-parallel attention with the TP ranks as processes: DP2 × TP2 (score: DP rank 0's TP
    # group runs the sequence), its rank 0 carrying every step to its follower.
    "${np4[@]}" "$fanout" score --model tiny --token-ids 1,2,3,4,5 --tp 2 --output "$work/logits_mpitp.f32" 2>"$work/stderr"
    diff_ep=$(logits_close "$work/logits.f32" "$work/logits_mpitp.f32")
    [[ $diff_ep == equal ]] && ok "mpirun -np 4 score --tp 2 equals EP1 within 1e-5" || bad "mpirun score --tp 2" "$diff_ep $(tail -3 "$work/stderr")"
    mpitp=$("${np4[@]}" "$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --tp 2 2>"$work/stderr")
    [[ $ep1 == "$mpitp" ]] && ok "mpirun -np 4 generate --tp 2 samples the same tokens as EP1" || bad "mpirun generate --tp 2" "'$mpitp' vs '$ep1' $(tail -3 "$work/stderr")"
    greedy1=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0 2>/dev/null)
    mpitp4=$("${np4[@]}" "$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0 --tp 4 --mtp 2 --microbatch on 2>"$work/stderr")
    [[ -n $greedy1 && $greedy1 == "$mpitp4" ]] && ok "mpirun -np 4 generate --tp 4 --mtp 2 --microbatch on: plain greedy tokens" || bad "mpirun generate --tp 4" "'$mpitp4' vs '$greedy1' $(tail -3 "$work/stderr")"
    proc2=$("$fanout" generate --model tiny --prompt-ids 1,2,3,4,5 --max-tokens 8 --temperature 0.8 --seed 3 --ep 2 --ranks processes 2>"$work/stderr")
    [[ $ep1 == "$proc2" ]] && ok "generate --ep 2 --ranks processes samples the same tokens as EP1" || bad "--ranks processes" "'$proc2' vs '$ep1' $(tail -3 "$work/stderr")"
    # A bad input under the launcher: every rank names it and the job ends (no rank left waiting).
    start=$SECONDS
    "${np4[@]}" "$fanout" score --model tiny --token-ids 1,2,999999 --output "$work/x.f32" >/dev/null 2>"$work/stderr"
    rc=$?
    if [[ $rc -ne 0 ]] && grep -qF "token id 999999 at index 2 is outside the vocabulary" "$work/stderr" && ((SECONDS - start < 60)); then
        ok "mpirun score with a bad token id fails fast, naming it"
    else bad "mpirun bad token" "exit $rc after $((SECONDS - start)) s: $(tail -3 "$work/stderr")"; fi
    expect_error "--ep other than the launcher's world" "--ep 2: the launcher started 4 processes" \
        "${np4[@]}" "$fanout" generate --model tiny --prompt-ids 1,2 --ep 2
else
    echo "SKIP ranks as processes: no mpirun"
fi
expect_error "score --ep that does not divide the experts" "ep=3 does not divide the model's 16 routed experts" \
    "$fanout" score --model tiny --token-ids 1,2 --ep 3 --output "$work/x.f32"

"$fanout" make-model --preset tiny --layers 2 --dtype fp8 --seed 7 --out "$work/fp8" 2>"$work/stderr" \
    && ok "make-model fp8" || bad "make-model fp8" "$(tail -1 "$work/stderr")"
grep -q '"quant_method": "fp8"' "$work/fp8/config.json" && ok "fp8 config has quantization_config" \
    || bad "fp8 config" "no quantization_config"
expect_ok "generate on fp8 weights, dequantized" '^[0-9]+(,[0-9]+){3}$' \
    "$fanout" generate --model "$work/fp8" --prompt-ids 9,8,7 --max-tokens 4 --ignore-eos
expect_ok "generate on fp8 weights, w8a8" '^[0-9]+(,[0-9]+){3}$' \
    "$fanout" generate --model "$work/fp8" --prompt-ids 9,8,7 --max-tokens 4 --ignore-eos --fp8-mode w8a8 --kv-dtype bf16
# The FP8 KV cache on the CPU path, and a GPU cache of f32 refused before anything loads.
expect_ok "generate over the fp8 KV cache" '^[0-9]+(,[0-9]+){7}$' \
    "$fanout" generate --model tiny --prompt-ids 9,8,7,6,5 --max-tokens 8 --ignore-eos --kv-dtype fp8
expect_error "--device cuda --kv-dtype f32" "$(gpu_flag_error "the GPU runner's cache holds bf16 or fp8 entries")" \
    "$fanout" generate --model tiny --prompt-ids 1,2 --device cuda --kv-dtype f32
"$fanout" make-model --preset tiny --layers 1 --shard-gb 0.05 --out "$work/sharded" 2>/dev/null
[[ -f $work/sharded/model.safetensors.index.json ]] && ok "make-model shards large checkpoints" \
    || bad "sharding" "no index"
expect_ok "generate on a sharded checkpoint" '^[0-9]+(,[0-9]+){1}$' \
    "$fanout" generate --model "$work/sharded" --prompt-ids 1,2 --max-tokens 2 --ignore-eos

# Text in, text out (the tiny model carries DeepSeek-V3's tokenizer).
expect_ok "tokenize raw text adds BOS" '^\[0,[0-9]+(,[0-9]+)*\]$' bash -c "echo 'Hello world' | '$fanout' tokenize --model tiny"
expect_ok "tokenize a chat" '^\[0,[0-9,]+\]$' bash -c "echo '[{\"role\":\"user\",\"content\":\"Hi\"}]' | '$fanout' tokenize --model tiny --chat"
expect_ok "generate from text" '.' "$fanout" generate --model tiny --prompt "Hello" --max-tokens 8 --ignore-eos
expect_ok "generate from a chat prompt" '.' "$fanout" generate --model tiny --chat --prompt "Hi there" --max-tokens 4 --ignore-eos
expect_error "tokenize: bad JSON line" "input line 2: not valid JSON" \
    bash -c "printf '\"ok\"\n{oops\n' | '$fanout' tokenize --model tiny --jsonl"
expect_error "generate: invalid UTF-8 prompt" "text is not valid UTF-8: bad byte 0xff at offset 2" \
    "$fanout" generate --model tiny --prompt $'ab\xffc' --max-tokens 2
expect_error "chat: unknown role" "messages[0]: role 'robot' is not one of" \
    bash -c "echo '[{\"role\":\"robot\",\"content\":\"x\"}]' | '$fanout' tokenize --model tiny --chat"
[[ -f $work/sharded/tokenizer.json ]] && ok "make-model copies DeepSeek-V3's tokenizer" || bad "tokenizer copy" "none"
rm -f "$work/sharded/tokenizer.json"
expect_error "model without a tokenizer" "no tokenizer.json in" \
    "$fanout" generate --model "$work/sharded" --prompt "hi" --max-tokens 2

# Bad input: a clear error, never a crash.
expect_error "token id past the vocabulary" "prompt token 129280 (index 1) is outside the vocabulary [0, 129280)" \
    "$fanout" generate --model tiny --prompt-ids 5,129280 --max-tokens 2
expect_error "token id that is not a number" "--prompt-ids: 'x7' (entry 1) is not a token id" \
    "$fanout" generate --model tiny --prompt-ids 5,x7 --max-tokens 2
expect_error "empty entry in the id list" "--token-ids: '' (entry 2) is not a token id" \
    "$fanout" score --model tiny --token-ids 1,2,,3 --output "$work/x.f32"
expect_error "negative temperature" "temperature must be a finite number >= 0" \
    "$fanout" generate --model tiny --prompt-ids 1 --temperature -1
expect_error "top-p out of range" "top_p must be in (0, 1]" \
    "$fanout" generate --model tiny --prompt-ids 1 --top-p 1.5
expect_error "missing model folder" "model folder '$work/nope' does not exist" \
    "$fanout" generate --model "$work/nope" --prompt-ids 1
mkdir -p "$work/trunc" && cp "$work/sharded/config.json" "$work/trunc/"
head -c 4000000 "$work/fp8/model.safetensors" > "$work/trunc/model.safetensors"
cp "$work/fp8/config.json" "$work/trunc/config.json"
expect_error "truncated safetensors" "out of range" \
    "$fanout" generate --model "$work/trunc" --prompt-ids 1
mkdir -p "$work/badcfg" && cp "$work/fp8/model.safetensors" "$work/badcfg/"
sed 's/"scoring_func": "sigmoid"/"scoring_func": "softmax"/' "$work/fp8/config.json" > "$work/badcfg/config.json"
expect_error "unsupported config value" "field 'scoring_func' is 'softmax'" \
    "$fanout" generate --model "$work/badcfg" --prompt-ids 1
expect_error "make-model without --layers for full-layers" "full-layers needs --layers N" \
    "$fanout" make-model --preset full-layers --out "$work/full"

# The memory plan refuses what cannot fit before loading anything (exit 2, the flag named, no "loaded").
expect_error "serve: a KV cache larger than the host, refused before loading" "at most --kv-memory-gb" \
    "$fanout" serve --model tiny --port 0 --kv-memory-gb 100000
grep -qE "^(loaded|loading)" "$work/stderr" && bad "serve --kv-memory-gb 100000 refused before loading" "it loaded the model first"
expect_error "serve: step workspaces larger than the host, refused before loading" "lower --max-num-seqs" \
    "$fanout" serve --model tiny --port 0 --max-num-seqs 100000000
grep -qE "^(loaded|loading)" "$work/stderr" && bad "serve --max-num-seqs 1e8 refused before loading" "it loaded the model first"

# Flags out of range are refused by name, before anything runs (before: --port 70000 listened on
# 4464, --threads 100000 hung, --max-tokens 10000000 allocated 12.8 GB first, NaN passed).
expect_error "serve: a port past 65535" "--port: Value 70000 not in range 0 to 65535" \
    "$fanout" serve --model tiny --port 70000
expect_error "serve: a NaN KV memory" "--kv-memory-gb: 'nan' is not a number" \
    "$fanout" serve --model tiny --port 0 --kv-memory-gb nan
expect_error "serve: no request in flight allowed" "--max-in-flight: Value 0 not in range" \
    "$fanout" serve --model tiny --port 0 --max-in-flight 0
expect_error "generate: 100,000 threads" "--threads: Value 100000 not in range 0 to 4096" \
    "$fanout" generate --model tiny --prompt-ids 1 --threads 100000
expect_error "generate: max tokens past the model's context, before the cache is made" \
    "--max-tokens 10000000 with a 1-token prompt: must be in 1.." \
    "$fanout" generate --model tiny --prompt-ids 1 --max-tokens 10000000
# The planner: nothing valid is an error, not an empty sweep; the EPs' order changes nothing.
expect_error "plan sweep --ep 0" "plan: EP 0 must divide the 256 routed experts" "$fanout" plan sweep --ep 0 --out "$work/s0"
expect_error "plan sweep --kv-len past its bound" "KV length 2147483647 must be in 0..16777216" \
    "$fanout" plan sweep --kv-len 2147483647 --out "$work/s0"
expect_error "plan layer: microbatch at batch 1" "microbatch splits the batch in two and needs batch >= 2" \
    "$fanout" plan layer --batch 1 --schedule microbatch
up=$("$fanout" plan sweep --ep 8 64 --out "$work/s1" --no-figure 2>&1 | grep -v ' -> ')
down=$("$fanout" plan sweep --ep 64 8 --out "$work/s2" --no-figure 2>&1 | grep -v ' -> ')
[[ -n $up && $up == "$down" ]] && ok "plan sweep: the same frontiers whatever the EPs' order" ||
    bad "plan sweep order" "$(diff <(echo "$up") <(echo "$down") | head -5)"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
