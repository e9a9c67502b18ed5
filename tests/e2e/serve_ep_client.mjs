// The official `openai` npm client against a data-parallel `fanout serve` (--ep N): 64 concurrent
// requests mixing chat and completions, streamed and not, with max_tokens 1..24 so that ranks run
// out of work at different times and idle ranks step empty while the others finish; then greedy
// completions sent all at once (so they land on different ranks), each equal to the single-rank
// `fanout generate` text, alone and again in the middle of other traffic.
// Usage: node serve_ep_client.mjs BASE_URL EXPECTED_JSON
//   EXPECTED_JSON: [{"prompt": "...", "text": "..."}], the text of `fanout generate --prompt P
//   --max-tokens 10 --ignore-eos`.
// Prints PASS/FAIL lines, then `SENT n` (requests sent) and `TOKENS n` (tokens they asked for, all
// generated under ignore_eos) for the caller's /metrics check; exits non-zero on failure.
import OpenAI from "openai";
import { readFileSync } from "node:fs";

const base = process.argv[2];
const expected = JSON.parse(readFileSync(process.argv[3], "utf8"));
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0, timeout: 120_000 });
let passed = 0, failed = 0, sent = 0, tokens = 0;
const check = (name, ok, detail = "") => {
  if (ok) { passed++; console.log(`PASS ${name}`); } else { failed++; console.log(`FAIL ${name} ${detail}`); }
};

// One request of a given shape; resolves to {text, finish, usage} or {error}.
async function request({ chat, stream, usage, prompt, max_tokens }) {
  sent++;
  tokens += max_tokens;
  const common = { model: "tiny", max_tokens, temperature: 0, ignore_eos: true };
  if (stream) common.stream = true;
  if (stream && usage) common.stream_options = { include_usage: true };
  try {
    const r = chat ? await client.chat.completions.create({ ...common, messages: [{ role: "user", content: prompt }] })
                   : await client.completions.create({ ...common, prompt });
    if (!stream) {
      const c = r.choices[0];
      return { text: chat ? c.message.content : c.text, finish: c.finish_reason, usage: r.usage };
    }
    let text = "", finish = null, u = null;
    for await (const chunk of r) {
      if (chunk.usage) u = chunk.usage;
      for (const c of chunk.choices) {
        text += (chat ? c.delta?.content : c.text) ?? "";
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    return { text, finish, usage: u };
  } catch (e) {
    return { error: `${e.status ?? ""} ${e.message}` };
  }
}

// 1. 64 concurrent requests: kinds cycle through completion/chat x plain/streamed, half the streams
// ask for usage; max_tokens covers 1..24; prompts of different lengths (prefills of 2..~60 tokens).
const N = 64;
const shapes = Array.from({ length: N }, (_, i) => ({
  chat: (i & 2) !== 0, stream: (i & 1) !== 0, usage: (i & 4) !== 0,
  prompt: `Request ${i}: ` + "tell me about the sea and the sky. ".repeat(i % 7),
  max_tokens: 1 + ((i * 7) % 24),
}));
const results = await Promise.all(shapes.map(request));
const bad = [];
results.forEach((r, i) => {
  const s = shapes[i];
  const kind = `${s.chat ? "chat" : "completion"}${s.stream ? " stream" : ""}`;
  if (r.error) bad.push(`#${i} ${kind}: ${r.error}`);
  else if (r.finish !== "length") bad.push(`#${i} ${kind}: finish_reason ${r.finish}`);
  else if ((!s.stream || s.usage) && r.usage?.completion_tokens !== s.max_tokens)
    bad.push(`#${i} ${kind}: usage ${JSON.stringify(r.usage)}, max_tokens ${s.max_tokens}`);
  else if (s.max_tokens > 1 && r.text.length === 0) bad.push(`#${i} ${kind}: no text`);
});
check(`${N} concurrent requests (chat and completions, streamed and not, max_tokens 1..24) all complete`,
  bad.length === 0, `${bad.length} bad: ${bad.slice(0, 5).join("; ")}`);

// 2. Greedy completions, all at once: each equals the single-rank `fanout generate` output.
async function greedy(label, extra) {
  const runs = expected.map((e, i) => request({ chat: false, stream: i % 2 === 1, usage: true, prompt: e.prompt, max_tokens: 10 }));
  const others = Array.from({ length: extra }, (_, i) =>
    request({ chat: i % 2 === 0, stream: i % 3 === 0, usage: false, prompt: `Background ${i}: ` + "more words here. ".repeat(i % 5), max_tokens: 3 + (i % 13) }));
  const [got] = await Promise.all([Promise.all(runs), Promise.all(others)]);
  const diff = [];
  got.forEach((r, i) => {
    if (r.error || r.text !== expected[i].text || r.finish !== "length")
      diff.push(`${JSON.stringify(expected[i].prompt)}: ${r.error ?? JSON.stringify(r.text)} vs ${JSON.stringify(expected[i].text)}`);
  });
  check(`${expected.length} concurrent greedy completions equal fanout generate (${label})`, diff.length === 0, diff.join("; "));
}
await greedy("alone", 0);
await greedy("among 24 other requests", 24);

console.log(`SENT ${sent}`);
console.log(`TOKENS ${tokens}`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
