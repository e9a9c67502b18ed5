#!/usr/bin/env bash
# Regenerates tests/fixtures/tokenizer/* from the Node oracles and checks
# decode(encode(x)) == x for every corpus line. Run from anywhere after `npm ci`.
set -euo pipefail
cd "$(dirname "$0")/../.."
F=tests/fixtures/tokenizer
J=scripts/js
node $J/make_corpus.mjs > $F/corpus.jsonl
node $J/tokenize.mjs < $F/corpus.jsonl > $F/corpus_ids.jsonl
node $J/tokenize.mjs --add-special-tokens < $F/corpus.jsonl > $F/corpus_ids_bos.jsonl
node $J/make_conversations.mjs > $F/conversations.jsonl
node $J/chat.mjs < $F/conversations.jsonl > $F/conversations_rendered.jsonl
node $J/chat.mjs --ids < $F/conversations.jsonl > $F/conversations_ids.jsonl
# Round trip: prints "line N: ..." for every line where decode(encode(x)) != x.
node $J/tokenize.mjs --decode < $F/corpus_ids.jsonl | node -e '
  const fs = require("fs");
  const want = fs.readFileSync(process.argv[1], "utf8").split("\n").filter(Boolean).map(JSON.parse);
  const got = fs.readFileSync(0, "utf8").split("\n").filter(Boolean).map(JSON.parse);
  let bad = 0;
  want.forEach((s, i) => { if (got[i] !== s) { bad++; console.log(`line ${i + 1}: ${JSON.stringify(s)} -> ${JSON.stringify(got[i])}`); } });
  console.error(`round trip: ${want.length - bad}/${want.length} lines ok`);' $F/corpus.jsonl
wc -c $F/*
