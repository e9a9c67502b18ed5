// The official `openai` npm client against `fanout serve`: chat and completions, streaming and
// not, 200 concurrent streams with every token accounted for, and a client that walks away.
// Usage: node serve_client.mjs BASE_URL   (prints PASS/FAIL lines, exits non-zero on failure)
import OpenAI from "openai";

const base = process.argv[2];
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: "unused", maxRetries: 0 });
let passed = 0, failed = 0;
const check = (name, ok, detail = "") => {
  if (ok) { passed++; console.log(`PASS ${name}`); } else { failed++; console.log(`FAIL ${name} ${detail}`); }
};

const messages = [{ role: "user", content: "Say hello in three languages." }];

// Non-streaming chat.
const full = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0, ignore_eos: true });
check("chat: one response with text and usage",
  full.choices[0].message.role === "assistant" && full.choices[0].message.content.length > 0 &&
  full.usage.completion_tokens === 12 && full.usage.prompt_tokens > 0 && full.choices[0].finish_reason === "length",
  JSON.stringify(full));

// Streaming chat: the same greedy text, piece by piece, then usage.
const stream = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0,
  ignore_eos: true, stream: true, stream_options: { include_usage: true } });
let text = "", usage = null, finish = null, role = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.role) role = c.delta.role;
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
check("chat stream: same text as non-streaming", text === full.choices[0].message.content, `${JSON.stringify(text)} vs ${JSON.stringify(full.choices[0].message.content)}`);
check("chat stream: role, finish_reason and usage", role === "assistant" && finish === "length" && usage?.completion_tokens === 12, JSON.stringify({ role, finish, usage }));

// Stop strings: the greedy text cut before the first occurrence, finish_reason "stop", streamed or not.
{
  const whole = full.choices[0].message.content;
  const cut = Math.max(1, Math.floor(whole.length / 2));
  const stopStr = whole.slice(cut, cut + 2);
  const expect = whole.slice(0, whole.indexOf(stopStr));
  const r = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0, ignore_eos: true, stop: [stopStr] });
  check("stop string: output ends before it", r.choices[0].message.content === expect && r.choices[0].finish_reason === "stop",
    `${JSON.stringify(r.choices[0].message.content)} vs ${JSON.stringify(expect)} (stop ${JSON.stringify(stopStr)})`);
  const rs = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 12, temperature: 0, ignore_eos: true, stop: stopStr, stream: true });
  let st = "", sf = null;
  for await (const chunk of rs) for (const c of chunk.choices) { st += c.delta?.content ?? ""; if (c.finish_reason) sf = c.finish_reason; }
  check("stop string: streamed output never shows it", st === expect && sf === "stop", JSON.stringify(st));
}

// Completions, both ways; a second identical prompt, sent at once, hits the prefix cache. Through
// `fanout router` too: the router counts the first prompt's blocks as pending on the engine it
// chose until that engine's KV events confirm them, so the repeat goes there without waiting.
const prompt = "The quick brown fox jumps over the lazy dog. ".repeat(12);
const c1 = await client.completions.create({ model: "tiny", prompt, max_tokens: 6, temperature: 0, ignore_eos: true });
const c2 = await client.completions.create({ model: "tiny", prompt, max_tokens: 6, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
let ctext = "", cusage = null;
for await (const chunk of c2) { if (chunk.usage) cusage = chunk.usage; for (const c of chunk.choices) ctext += c.text ?? ""; }
check("completions: streaming equals non-streaming", ctext === c1.choices[0].text, `${JSON.stringify(ctext)} vs ${JSON.stringify(c1.choices[0].text)}`);
check("completions: the repeated prompt reuses cached KV", (cusage?.prompt_tokens_details?.cached_tokens ?? 0) >= 64, JSON.stringify(cusage));

// Sampling with a seed is reproducible.
const s1 = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 8, temperature: 0.9, seed: 5 });
const s2 = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 8, temperature: 0.9, seed: 5 });
check("seeded sampling is reproducible", s1.choices[0].message.content === s2.choices[0].message.content);

// 200 concurrent streams: each must deliver its 8 tokens and finish.
const N = 200;
const results = await Promise.all(Array.from({ length: N }, async (_, i) => {
  const s = await client.chat.completions.create({ model: "tiny", max_tokens: 8, ignore_eos: true, temperature: 0.5, seed: i,
    messages: [{ role: "user", content: `Request number ${i}: tell me something.` }], stream: true, stream_options: { include_usage: true } });
  let u = null, f = null, t = "";
  for await (const chunk of s) { if (chunk.usage) u = chunk.usage; for (const c of chunk.choices) { if (c.finish_reason) f = c.finish_reason; t += c.delta?.content ?? ""; } }
  return { u, f, t };
}));
const complete = results.filter(r => r.f === "length" && r.u?.completion_tokens === 8).length;
check(`${N} concurrent streams all complete with 8 tokens each`, complete === N, `${complete}/${N}`);

// A client that walks away mid-stream: the server cancels it and keeps serving.
const ctrl = new AbortController();
try {
  const s = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 100000, ignore_eos: true, stream: true }, { signal: ctrl.signal });
  let n = 0;
  for await (const _ of s) { if (++n === 3) ctrl.abort(); }
} catch (e) { /* aborted */ }
await new Promise(r => setTimeout(r, 1500));
const metrics = await (await fetch(`${base}/metrics`)).text();
const aborted = Number((metrics.match(/fanout_requests_aborted_total\{[^}]*\} (\d+)/) || [])[1] || 0);
check("a disconnected stream is cancelled", aborted >= 1, `aborted=${aborted}`);
// The same for a non-streaming request abandoned by its client.
const ctrl2 = new AbortController();
setTimeout(() => ctrl2.abort(), 500);
try { await client.chat.completions.create({ model: "tiny", messages, max_tokens: 100000, ignore_eos: true }, { signal: ctrl2.signal }); }
catch (e) { /* aborted */ }
await new Promise(r => setTimeout(r, 1500));
const metrics2 = await (await fetch(`${base}/metrics`)).text();
const aborted2 = Number((metrics2.match(/fanout_requests_aborted_total\{[^}]*\} (\d+)/) || [])[1] || 0);
check("an abandoned non-streaming request is cancelled", aborted2 >= aborted + 1, `aborted ${aborted} -> ${aborted2}`);
const after = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 2 });
check("the server keeps serving after a disconnect", after.choices[0].message.content !== undefined);

// Errors through the client: the right status and OpenAI's error shape.
try { await client.chat.completions.create({ model: "nope", messages }); check("unknown model is 404", false); }
catch (e) { check("unknown model is 404", e.status === 404 && e.error?.code === "model_not_found", `${e.status}`); }
try { await client.chat.completions.create({ model: "tiny", messages, max_tokens: 0 }); check("max_tokens 0 is 400", false); }
catch (e) { check("max_tokens 0 is 400", e.status === 400 && e.error?.param === "max_tokens", `${e.status} ${JSON.stringify(e.error)}`); }

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
