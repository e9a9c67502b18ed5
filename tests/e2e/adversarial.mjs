// The public HTTP surface as a hostile client sees it: each finding of the security review and its
// family, with (a) the status, (b) OpenAI's error shape {"error": {"message", "type", "param",
// "code"}} for errors, and (c) the server still answering afterwards: GET /health within 1 s after
// every case, and a real short completion every few cases.
//
// Usage: node adversarial.mjs BASE_URL
// Optional environment (set by adversarial_test.sh; cases needing one are skipped without it, so
// the script can be pointed at a router):
//   ADV_SERVER_PID          the server's pid: its RSS (/proc/PID/status VmRSS) under a 300 MB body
//   ADV_DEFAULT_MAX_TOKENS  the server's --default-max-tokens
//   ADV_ALT_BASE, ADV_ALT_NAME    a server started with `--model DIR/ --allowed-hosts attacker.example`,
//                                 and DIR's name
//   ADV_EVIL_BASE, ADV_EVIL_NAME  a server started with `--served-model-name NAME` (quote and brace)
//   ADV_TOKEN_ID, ADV_TOKEN_TEXT  a token id and its text (default: 33310, "hello" in the tiny vocabulary)
//   ADV_GREEDY_ID           the token greedy decoding picks first after [0, 1000, 2000, 3000]
// Prints PASS/FAIL lines (a FAIL says what was expected and what came back), the measured figures
// as INFO lines, then `N passed, M failed`; exits non-zero on any failure.
import net from "node:net";
import fs from "node:fs";

const base = (process.argv[2] || "").replace(/\/$/, "");
if (!base) { console.error("usage: node adversarial.mjs BASE_URL"); process.exit(2); }
const url = new URL(base);
const HOST = url.hostname.replace(/^\[|\]$/g, "");
const PORT = Number(url.port || 80);
const HOSTHDR = url.host;
const env = process.env;
const suiteStart = Date.now();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const clip = (s, n = 300) => { s = String(s); return s.length > n ? s.slice(0, n) + `...(${s.length} chars)` : s; };

// Whole-suite watchdog: a hang is a failure, never a CI timeout.
setTimeout(() => { console.log("FAIL watchdog: the suite ran past 240 s"); console.log(`${passed} passed, ${failed + 1} failed`); process.exit(1); }, 240_000).unref();

// ---------------------------------------------------------------------------------------------
// Reporting: a case is a list of assertions; it passes when all do.

let passed = 0, failed = 0, caseCount = 0;
const info = (msg) => console.log(`INFO ${msg}`);

class Case {
  constructor(name) { this.name = name; this.fails = []; }
  // expect(cond, what was expected, what came back)
  expect(cond, expected, got) { if (!cond) this.fails.push(`expected ${expected}; got ${clip(got, 400)}`); return !!cond; }
}

async function kase(name, fn, { completion = false, alive: checkAlive = true, base: b = base, model: name_ = undefined } = {}) {
  const c = new Case(name);
  try { await fn(c); } catch (e) { c.fails.push(`threw ${e?.stack || e}`); }
  if (checkAlive) await alive(c, b);
  if (checkAlive && (completion || ++caseCount % 4 === 0)) await completionWorks(c, b, name_ ?? modelName);
  if (c.fails.length === 0) { passed++; console.log(`PASS ${name}`); }
  else { failed++; console.log(`FAIL ${name}: ${c.fails.join(" | ")}`); }
}

// ---------------------------------------------------------------------------------------------
// HTTP helpers: fetch for well-formed requests, raw sockets where the framing must be hostile.

async function req(method, path, { body, headers = {}, timeoutMs = 10_000, b = base } = {}) {
  const t0 = performance.now();
  const h = { ...headers };
  if (body !== undefined && !Object.keys(h).some((k) => k.toLowerCase() === "content-type")) h["content-type"] = "application/json";
  const res = await fetch(b + path, { method, headers: h, body: typeof body === "object" && !(body instanceof Uint8Array) ? JSON.stringify(body) : body, signal: AbortSignal.timeout(timeoutMs) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch {}
  return { status: res.status, headers: res.headers, text, json, ms: performance.now() - t0 };
}
const post = (path, body, opts = {}) => req("POST", path, { body, ...opts });

function isErrorShape(j) {
  return !!(j && typeof j === "object" && j.error && typeof j.error === "object" && typeof j.error.message === "string" &&
    j.error.message.length > 0 && typeof j.error.type === "string" && "param" in j.error && "code" in j.error);
}

// The status, and for errors OpenAI's shape; `msg` (a regex) must match the error message when given.
function expectStatus(c, r, status, { msg, param } = {}) {
  const statuses = Array.isArray(status) ? status : [status];
  const got = `${r.status} ${clip(r.text ?? r.body ?? "", 300)}`;
  if (!c.expect(statuses.includes(r.status), `status ${statuses.join(" or ")}`, got)) return false;
  if (r.status >= 400) {
    const j = r.json ?? (() => { try { return JSON.parse(r.text ?? r.body); } catch { return null; } })();
    c.expect(isErrorShape(j), `an OpenAI error body {"error": {"message", "type", "param", "code"}}`, got);
    if (msg) c.expect(msg.test(j?.error?.message ?? ""), `an error message matching ${msg}`, got);
    if (param !== undefined) c.expect(j?.error?.param === param, `error.param ${JSON.stringify(param)}`, got);
  }
  return true;
}

async function health(b = base) {
  const t0 = performance.now();
  try {
    const r = await fetch(b + "/health", { signal: AbortSignal.timeout(3000) });
    await r.text();
    return { status: r.status, ms: performance.now() - t0 };
  } catch (e) { return { status: 0, ms: performance.now() - t0, error: String(e) }; }
}

async function alive(c, b = base) {
  const h = await health(b);
  c.expect(h.status === 200 && h.ms < 1000, "GET /health 200 within 1 s afterwards", `${h.status} in ${h.ms.toFixed(0)} ms ${h.error ?? ""}`);
}

let modelName = "tiny";
async function completionWorks(c, b = base, name = modelName) {
  try {
    const r = await post("/v1/completions", { model: name, prompt: "Hello", max_tokens: 2, temperature: 0, ignore_eos: true }, { timeoutMs: 10_000, b });
    c.expect(r.status === 200 && r.json?.usage?.completion_tokens === 2 && r.ms < 5000,
      "a short completion (max_tokens 2) to succeed within 5 s afterwards", `${r.status} in ${r.ms.toFixed(0)} ms: ${clip(r.text)}`);
  } catch (e) { c.expect(false, "a short completion to succeed afterwards", String(e)); }
}

async function metric(name, b = base) {
  const t = await (await fetch(b + "/metrics", { signal: AbortSignal.timeout(3000) })).text();
  const m = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(t);
  return m ? Number(m[1]) : NaN;
}

// Parses HTTP/1.x responses from raw bytes. heads[i]: whether the i-th request was HEAD (no body).
function parseResponses(buf, heads = []) {
  const finals = [], interim = [];
  let off = 0, error = null;
  while (off < buf.length) {
    const end = buf.indexOf("\r\n\r\n", off);
    if (end < 0) break;
    const head = buf.subarray(off, end).toString("latin1");
    const [statusLine, ...lines] = head.split("\r\n");
    const m = /^HTTP\/(\d\.\d) (\d{3})/.exec(statusLine);
    if (!m) { error = `bad status line ${JSON.stringify(statusLine)}`; break; }
    const headers = {};
    for (const l of lines) {
      const i = l.indexOf(":");
      const k = l.slice(0, i).trim().toLowerCase(), v = l.slice(i + 1).trim();
      headers[k] = k in headers ? `${headers[k]}, ${v}` : v;
    }
    const r = { status: Number(m[2]), version: m[1], headers, head, body: "", complete: false };
    let p = end + 4;
    if (r.status >= 100 && r.status < 200) { interim.push(r); off = p; continue; }
    finals.push(r);
    if (heads[finals.length - 1] || r.status === 204 || r.status === 304) { r.complete = true; off = p; continue; }
    if (/chunked/i.test(headers["transfer-encoding"] ?? "")) {
      const parts = [];
      for (;;) {
        const le = buf.indexOf("\r\n", p);
        if (le < 0) break;
        const size = parseInt(buf.subarray(p, le).toString("latin1"), 16);
        if (Number.isNaN(size)) { error = "bad chunk size"; break; }
        if (size === 0) { const te = buf.indexOf("\r\n", le + 2); if (te >= 0) { p = te + 2; r.complete = true; } break; }
        if (buf.length < le + 2 + size + 2) break;
        parts.push(buf.subarray(le + 2, le + 2 + size));
        p = le + 2 + size + 2;
      }
      r.body = Buffer.concat(parts).toString("utf8");
      if (!r.complete) { off = buf.length; break; }
      off = p;
      continue;
    }
    if ("content-length" in headers) {
      const n = Number(headers["content-length"]);
      r.body = buf.subarray(p, Math.min(buf.length, p + n)).toString("utf8");
      if (buf.length - p < n) { off = buf.length; break; }
      r.complete = true;
      off = p + n;
      continue;
    }
    r.body = buf.subarray(p).toString("utf8");  // ends with the connection
    r.closeDelimited = true;
    off = buf.length;
    break;
  }
  return { finals, interim, rest: buf.subarray(off), error };
}

// Sends `parts` (strings or Buffers; a number is a pause in ms) on a fresh connection; resolves once
// `responses` complete responses came back (then waits settleMs for stray bytes), the server closed
// the connection, or timeoutMs passed.
function raw(parts, { responses = 1, heads = [], timeoutMs = 5000, settleMs = 0 } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const sock = net.connect({ host: HOST, port: PORT });
    let buf = Buffer.alloc(0), done = false, closed = false, error = null, firstByteMs = null, settling = false;
    const finish = (why) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      const p = parseResponses(buf, heads);
      sock.destroy();
      const r0 = p.finals[0];
      let json = null;
      try { json = JSON.parse(r0?.body); } catch {}
      resolve({ why, closed, error, firstByteMs, ms: performance.now() - t0, raw: buf, ...p,
        status: r0?.status ?? 0, body: r0?.body ?? "", text: r0 ? r0.body : `(no response: ${why}${error ? ", " + error : ""})`, json,
        headers: r0?.headers ?? {} });
    };
    const timer = setTimeout(() => finish("timeout"), timeoutMs);
    sock.on("data", (d) => {
      if (firstByteMs === null) firstByteMs = performance.now() - t0;
      buf = Buffer.concat([buf, d]);
      const p = parseResponses(buf, heads);
      if (!settling && p.finals.filter((r) => r.complete).length >= responses) {
        settling = true;
        if (settleMs > 0) setTimeout(() => finish("complete"), settleMs); else finish("complete");
      }
    });
    sock.on("error", (e) => { error = e.code || String(e); });
    sock.on("close", () => { closed = true; finish("closed"); });
    sock.on("connect", async () => {
      for (const part of parts) {
        if (done) return;
        if (typeof part === "number") await sleep(part);
        else if (!sock.destroyed) sock.write(part);
      }
    });
  });
}

const jsonHead = (path, len, extra = "") =>
  `POST ${path} HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n${extra}\r\n`;
const rawPost = (path, body, extra = "") => jsonHead(path, Buffer.byteLength(body), extra) + body;

function rssKb(pid) {
  try { return Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, "utf8"))[1]); } catch { return NaN; }
}

// ---------------------------------------------------------------------------------------------
// Probes started now and judged at the end (so the deadlines cost no time of their own).

function deadlineProbe(parts) {
  const t0 = Date.now();
  const probe = { closedAfterMs: null, got: "" };
  const sock = net.connect({ host: HOST, port: PORT });
  let i = 0, timer = null;
  sock.on("connect", () => {
    sock.write(parts[i++]);
    timer = setInterval(() => { if (i < parts.length && !sock.destroyed) sock.write(parts[i++]); }, 1000);
  });
  sock.on("data", (d) => { probe.got += d.toString("latin1"); });
  sock.on("error", () => {});
  sock.on("close", () => { probe.closedAfterMs = Date.now() - t0; clearInterval(timer); });
  probe.t0 = t0;
  probe.destroy = () => { clearInterval(timer); sock.destroy(); };
  return probe;
}
// A head trickled one byte a second, forever: the header deadline (10 s from the connection) ends it.
const headerProbe = deadlineProbe([..."POST /v1/completions HTTP/1.1\r\nHost: " + HOSTHDR + "\r\nX-Slow: " + "a".repeat(200)]);
// A complete head promising 1000 bytes, 10 sent, then silence: the body deadline (30 s) ends it.
const bodyProbe = deadlineProbe([jsonHead("/v1/completions", 1000) + '{"model":"']);

// ---------------------------------------------------------------------------------------------

{
  const m = await req("GET", "/v1/models");
  if (m.status === 200 && m.json?.data?.[0]?.id) modelName = m.json.data[0].id;
  else { console.log(`FAIL the server at ${base} does not answer GET /v1/models: ${m.status} ${clip(m.text)}`); console.log("0 passed, 1 failed"); process.exit(1); }
}
const model = modelName;
const msgs = [{ role: "user", content: "x" }];

// === 1. Remote-crash family: bodies nested 100,000 deep =====================================
const N = 100_000;
const deepArr = "[".repeat(N) + "]".repeat(N);
const deepObj = '{"a":'.repeat(N) + "1" + "}".repeat(N);
const deepCases = [
  ["chat messages[].tool_calls[].function.arguments", "/v1/chat/completions",
    `{"model":${JSON.stringify(model)},"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":${deepArr}}}]},{"role":"user","content":"x"}]}`],
  ["chat messages[].content", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":${deepArr}}]}`],
  ["chat logit_bias", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":"x"}],"logit_bias":${deepArr}}`],
  ["chat logit_bias value", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":"x"}],"logit_bias":{"5":${deepArr}}}`],
  ["chat stop", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":"x"}],"stop":${deepArr}}`],
  ["chat stream_options", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":"x"}],"stream":true,"stream_options":{"include_usage":${deepArr}}}`],
  ["chat top-level unknown field", "/v1/chat/completions", `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":"x"}],"zzz":${deepArr}}`],
  ["completions prompt", "/v1/completions", `{"model":${JSON.stringify(model)},"prompt":${deepArr}}`],
  ["completions unknown field, objects", "/v1/completions", `{"model":${JSON.stringify(model)},"prompt":"x","zzz":${deepObj}}`],
  ["the body itself (an array)", "/v1/completions", deepArr],
  ["the body itself (objects)", "/v1/chat/completions", deepObj],
  ["unterminated", "/v1/completions", `{"model":${JSON.stringify(model)},"prompt":"x","zzz":` + "[".repeat(N)],
  ["model field", "/v1/completions", `{"model":${deepArr},"prompt":"x"}`],
];
for (const [where, path, body] of deepCases) {
  await kase(`deep JSON (${N} levels) in ${where} -> 400`, async (c) => {
    const r = await post(path, body);
    expectStatus(c, r, 400, { msg: /deeper than|not valid JSON/ });
  });
}
// The bound is on depth, not on arrays or objects: 60 levels parse (the field is then judged), 70 do not.
await kase("depth bound: 60 levels parse (unknown field named), 70 levels are refused", async (c) => {
  const d = (n) => "[".repeat(n) + "]".repeat(n);
  const r60 = await post("/v1/completions", `{"model":${JSON.stringify(model)},"prompt":"x","zzz":${d(60)}}`);
  expectStatus(c, r60, 400, { msg: /unknown field 'zzz'/, param: "zzz" });
  const r70 = await post("/v1/completions", `{"model":${JSON.stringify(model)},"prompt":"x","zzz":${d(70)}}`);
  expectStatus(c, r70, 400, { msg: /deeper than 64/ });
});
await kase("deep JSON sent as a raw, chunked body -> 400", async (c) => {
  const body = `{"model":${JSON.stringify(model)},"messages":[{"role":"user","content":${deepArr}}]}`;
  const chunks = [];
  for (let i = 0; i < body.length; i += 65536) { const s = body.slice(i, i + 65536); chunks.push(`${s.length.toString(16)}\r\n${s}\r\n`); }
  const r = await raw([`POST /v1/chat/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n`, ...chunks, "0\r\n\r\n"]);
  expectStatus(c, r, 400, { msg: /deeper than/ });
}, { completion: true });

// === 2. Body limits and framing ===============================================================
// Streams a body of `total` bytes (chunked, or with its Content-Length) with backpressure, and stops
// sending once the server answers or closes; samples the server's RSS meanwhile when its pid is known.
async function flood({ total, chunked, piece = 1 << 20, timeoutMs = 20_000 }) {
  const pid = Number(env.ADV_SERVER_PID || 0);
  const rss0 = pid ? rssKb(pid) : NaN;
  let rssMax = rss0;
  const sampler = pid ? setInterval(() => { const v = rssKb(pid); if (v > rssMax) rssMax = v; }, 20) : null;
  const result = await new Promise((resolve) => {
    const t0 = performance.now();
    const sock = net.connect({ host: HOST, port: PORT });
    let buf = Buffer.alloc(0), sent = 0, stop = false, answeredMs = null, error = null, finished = false;
    const wake = [];
    const kick = () => { while (wake.length) wake.shift()(); };
    const end = (why) => {
      if (finished) return;
      finished = true;
      stop = true;
      kick();
      clearTimeout(giveUp);
      // A moment for the rest of the answer, then hang up.
      setTimeout(() => { sock.destroy(); resolve({ why, sent, ms: performance.now() - t0, answeredMs, error, ...parseResponses(buf) }); }, why === "closed" ? 0 : 200);
    };
    const giveUp = setTimeout(() => end("timeout"), timeoutMs);
    sock.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      if (answeredMs === null) answeredMs = performance.now() - t0;
      if (buf.includes("\r\n\r\n")) { stop = true; kick(); setTimeout(() => end("answered"), 100); }
    });
    sock.on("error", (e) => { error = e.code || String(e); });
    sock.on("close", () => end("closed"));
    sock.on("drain", kick);
    sock.on("connect", async () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\n` +
        (chunked ? "Transfer-Encoding: chunked\r\n\r\n" : `Content-Length: ${total}\r\n\r\n`));
      const prefix = `{"model":"tiny","prompt":"`;
      const frame = (body) => (chunked ? Buffer.from(`${body.length.toString(16)}\r\n${body}\r\n`) : Buffer.from(body));
      // About 64 KB per write, with backpressure.
      const perWrite = Math.max(1, Math.floor((64 << 10) / piece));
      const mk = (first) => {
        const parts = first ? [frame(prefix)] : [];
        for (let k = 0; k < perWrite; k++) parts.push(frame("a".repeat(piece)));
        return Buffer.concat(parts);
      };
      const firstBuf = mk(true), restBuf = mk(false), perBuf = piece * perWrite;
      for (let i = 0; sent < total && !stop; i++) {
        const ok = sock.write(i === 0 ? firstBuf : restBuf);
        sent += perBuf;
        if (!ok && !stop) await new Promise((r) => { wake.push(r); setTimeout(r, 2000); });
        else await new Promise((r) => setImmediate(r));
      }
      if (!stop && chunked) sock.write("0\r\n\r\n");
    });
  });
  if (sampler) clearInterval(sampler);
  const r = result.finals[0];
  let json = null;
  try { json = JSON.parse(r?.body); } catch {}
  return { ...result, pid, rss0, rssMax, status: r?.status ?? 0, text: r ? r.body : `(no response: ${result.why}, ${result.error ?? ""})`, json };
}

await kase("300 MB chunked body -> 413 quickly, RSS grows < 100 MB", async (c) => {
  const r = await flood({ total: 300 << 20, chunked: true });
  expectStatus(c, r, 413);
  c.expect(r.answeredMs !== null && r.answeredMs < 5000, "the 413 within 5 s", `${r.answeredMs?.toFixed(0)} ms (${r.why})`);
  const growMb = (r.rssMax - r.rss0) / 1024;
  info(`300 MB chunked body: ${r.status || "no answer"} after ${r.answeredMs?.toFixed(0)} ms, ${(r.sent / (1 << 20)).toFixed(0)} MB written before the answer; ` +
    (r.pid ? `server RSS ${(r.rss0 / 1024).toFixed(0)} MB -> max ${(r.rssMax / 1024).toFixed(0)} MB (+${growMb.toFixed(1)} MB)` : "RSS not measured (no ADV_SERVER_PID)"));
  if (r.pid) c.expect(growMb < 100, "server RSS to grow < 100 MB", `+${growMb.toFixed(1)} MB (${r.rss0} kB -> ${r.rssMax} kB)`);
  c.expect(r.sent < 300 << 20, "the server to answer before the whole 300 MB was written", `${r.sent} bytes written`);
}, { completion: true });

await kase("Content-Length: 9 MB (head only) -> 413 without waiting for the body", async (c) => {
  const r = await raw([jsonHead("/v1/completions", 9 * 1024 * 1024)], { timeoutMs: 3000 });
  expectStatus(c, r, 413);
});
// What most clients do: write the whole body, then read. The server answers 413 once it has read
// 8 MB (or at the head, for Content-Length) and closes; unless it closes in stages (half-close, then
// drain what the client still sends: RFC 9112 section 9.6), the reset of its close can reach the
// client before the 413 is read, and fetch sees "EPIPE" instead of the answer.
await kase("a 9 MB body through fetch (written whole, then read) -> the 413 arrives, three times out of three", async (c) => {
  const body = '{"model":"tiny","prompt":"' + "a".repeat(9 << 20) + '"}';
  for (let i = 0; i < 3; i++) {
    try {
      const r = await post("/v1/completions", body, { timeoutMs: 10_000 });
      if (!expectStatus(c, r, 413)) c.fails.push(`(try ${i + 1})`);
    } catch (e) {
      c.expect(false, `status 413 (try ${i + 1})`, `fetch threw ${e.message}: ${e.cause?.code ?? ""} ${e.cause?.message ?? ""}`);
    }
  }
});
await kase("9 MB chunked in 4 KB chunks -> 413", async (c) => {
  const r = await flood({ total: 9 << 20, chunked: true, piece: 4096 });
  expectStatus(c, r, 413);
});
await kase("1 MB body (under the limit) in 1-byte chunks -> parsed and judged (400: not valid JSON), not 413", async (c) => {
  // Six bytes of framing per body byte: the limit counts body bytes, and a million chunks cost no more.
  const r = await flood({ total: 1 << 20, chunked: true, piece: 1, timeoutMs: 20_000 });
  expectStatus(c, r, 400, { msg: /not valid JSON/ });
  info(`1 MB body in 1-byte chunks: ${r.status} after ${r.ms.toFixed(0)} ms`);
});
await kase("Content-Length: 2^63 and 2^64+1 -> 413 or 400", async (c) => {
  for (const len of ["9223372036854775807", "18446744073709551617"]) {
    const r = await raw([`POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n\r\n`], { timeoutMs: 3000 });
    expectStatus(c, r, [400, 413]);
  }
});
await kase("Content-Length: -5 -> 400 within 1 s", async (c) => {
  const r = await raw([`POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\nContent-Length: -5\r\n\r\n{}`], { timeoutMs: 3000 });
  expectStatus(c, r, 400);
  c.expect(r.firstByteMs !== null && r.firstByteMs < 1000, "the answer within 1 s", `${r.firstByteMs?.toFixed(0)} ms (${r.why})`);
});
await kase("malformed framing family -> 400 (+5, 0x10, two different Content-Lengths, bad chunk size, chunk size overflow, garbage request line)", async (c) => {
  const h = `POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\n`;
  const variants = [
    ["Content-Length: +5", `${h}Content-Length: +5\r\n\r\n{}`],
    ["Content-Length: 0x10", `${h}Content-Length: 0x10\r\n\r\n{}`],
    ["two different Content-Lengths", `${h}Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}`],
    ["chunk size zz", `${h}Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`],
    ["chunk size overflow", `${h}Transfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n{}\r\n0\r\n\r\n`],
    ["garbage request line", "GARBAGE\r\n\r\n"],
    ["space in the method", `GE T /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`],
    ["NUL in a header", `GET /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\nX-A: a\0b\r\n\r\n`],
  ];
  for (const [what, bytes] of variants) {
    const r = await raw([bytes], { timeoutMs: 3000 });
    if (!expectStatus(c, r, [400, 413])) c.fails.push(`(in: ${what})`);
  }
});
await kase("request smuggling family (CL+TE, TE+CL, TE not ending in chunked) -> one 400, the hidden request never answered", async (c) => {
  // Each carries a second request inside what one reading of the framing calls the body; a server
  // must refuse the ambiguity (400 and close), never answer the hidden GET /v1/nothing (a 404).
  const body = `{"model":${JSON.stringify(model)},"prompt":"x","max_tokens":1}`;
  const chunked = `${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`;
  const hidden = `GET /v1/nothing HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`;
  const head = `POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\n`;
  // RFC 9112 section 6.3: a request whose Transfer-Encoding does not end in chunked has no length a
  // server can trust: 400 and close. Read as body-less, its body becomes the next request.
  const variants = [
    ["Content-Length then Transfer-Encoding: chunked", `Content-Length: ${chunked.length + hidden.length}\r\nTransfer-Encoding: chunked\r\n\r\n${chunked}${hidden}`],
    ["Transfer-Encoding: chunked then Content-Length", `Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n${chunked}${hidden}`],
    ["Transfer-Encoding: chunked, identity", `Transfer-Encoding: chunked, identity\r\n\r\n${hidden}`],
    ["Transfer-Encoding: gzip", `Transfer-Encoding: gzip\r\n\r\n${hidden}`],
    ["Transfer-Encoding: identity", `Transfer-Encoding: identity\r\n\r\n${hidden}`],
  ];
  for (const [what, rest] of variants) {
    const r = await raw([`${head}${rest}`], { responses: 2, timeoutMs: 3000, settleMs: 300 });
    const statuses = r.finals.map((x) => x.status);
    c.expect(JSON.stringify(statuses) === "[400]" && r.closed, `${what}: one 400, then the connection closed`,
      `${JSON.stringify(statuses)}${r.closed ? "" : " (left open)"}: ${r.finals.map((x) => clip(x.body, 110)).join(" then ")}`);
    if (r.finals[0]) expectStatus(c, r, 400);
  }
});
await kase("a 20 KB head -> 431", async (c) => {
  const r = await raw([`GET /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\nX-Big: ${"a".repeat(20_000)}\r\n\r\n`], { timeoutMs: 3000 });
  expectStatus(c, r, 431);
});
await kase("10,000 tiny headers -> 431 (or 400)", async (c) => {
  const r = await raw([`GET /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\n${"X: y\r\n".repeat(10_000)}\r\n`], { timeoutMs: 3000 });
  expectStatus(c, r, [431, 400]);
});
await kase("Content-Length larger than sent, then silence: /health answers while that client waits", async (c) => {
  const sock = net.connect({ host: HOST, port: PORT });
  let answered = "";
  sock.on("data", (d) => (answered += d));
  sock.on("error", () => {});
  await new Promise((r) => sock.on("connect", r));
  sock.write(jsonHead("/v1/completions", 5000) + '{"model":');
  await sleep(1500);
  const h = await health();
  c.expect(h.status === 200 && h.ms < 1000, "GET /health 200 within 1 s while the body is missing", `${h.status} in ${h.ms.toFixed(0)} ms`);
  c.expect(answered === "" && !sock.destroyed, "the waiting client neither answered nor cut off before the body deadline", clip(answered));
  sock.destroy();
});

// === 3. Slow clients ===========================================================================
await kase("1,100 slow clients (a byte a second): /health within 1 s, a completion within 5 s", async (c) => {
  const socks = [];
  const headText = `POST /v1/completions HTTP/1.1\r\nHost: ${HOSTHDR}\r\nContent-Type: application/json\r\n`;
  let closedEarly = 0, gotBytes = 0;
  const open = (i) => new Promise((resolve) => {
    const s = net.connect({ host: HOST, port: PORT });
    s.pos = 0;
    s.on("connect", () => {
      // 1,000 trickle their head; 100 send a whole head and trickle the body.
      s.text = i < 1000 ? headText : jsonHead("/v1/completions", 100_000);
      if (i < 1000) s.write(s.text[s.pos++]); else { s.write(s.text); s.text = '{"model":"' + "a".repeat(1000); }
      resolve(s);
    });
    s.on("error", () => resolve(s));
    s.on("data", () => gotBytes++);
    s.on("close", () => { if (!s.ours) closedEarly++; });
  });
  const t0 = performance.now();
  for (let i = 0; i < 1100; i += 100) socks.push(...(await Promise.all(Array.from({ length: 100 }, (_, k) => open(i + k)))));
  const openMs = performance.now() - t0;
  const tick = setInterval(() => { for (const s of socks) if (!s.destroyed && s.text && s.pos < s.text.length) s.write(s.text[s.pos++]); }, 1000);
  try {
    await sleep(1200);
    const conns = await metric("fanout_http_open_connections");
    const lat = [];
    for (let k = 0; k < 3; k++) { const h = await health(); lat.push(h); await sleep(200); }
    const worst = Math.max(...lat.map((h) => h.ms));
    info(`1,100 slow clients (opened in ${openMs.toFixed(0)} ms, server counts ${conns} open connections): /health ${lat.map((h) => h.ms.toFixed(0)).join(", ")} ms`);
    c.expect(lat.every((h) => h.status === 200) && worst < 1000, "GET /health 200 within 1 s, three times", lat.map((h) => `${h.status} in ${h.ms.toFixed(0)} ms`).join(", "));
    c.expect(conns >= 1000, "the server to hold the slow connections open (fanout_http_open_connections >= 1000)", conns);
    const r = await post("/v1/completions", { model, prompt: "Hello there", max_tokens: 4, temperature: 0 }, { timeoutMs: 8000 });
    info(`completion (max_tokens 4) among 1,100 slow clients: ${r.status} in ${r.ms.toFixed(0)} ms`);
    c.expect(r.status === 200 && r.ms < 5000, "a completion (max_tokens 4) 200 within 5 s (429/503 not acceptable)", `${r.status} in ${r.ms.toFixed(0)} ms: ${clip(r.text)}`);
    const m = await req("GET", "/v1/models", { timeoutMs: 3000 });
    c.expect(m.status === 200 && m.ms < 1000, "GET /v1/models 200 within 1 s", `${m.status} in ${m.ms.toFixed(0)} ms`);
    c.expect(closedEarly === 0 && gotBytes === 0, "no slow client answered or cut off within the header deadline", `${closedEarly} closed, ${gotBytes} answered`);
  } finally {
    clearInterval(tick);
    for (const s of socks) { s.ours = true; s.destroy(); }
  }
  // The server notices them gone.
  let conns = NaN;
  for (let k = 0; k < 30; k++) { conns = await metric("fanout_http_open_connections"); if (conns < 50) break; await sleep(100); }
  c.expect(conns < 50, "open connections back under 50 within 3 s after the clients left", conns);
}, { completion: true });

// === 4. Stalls =================================================================================
if (env.ADV_DEFAULT_MAX_TOKENS) {
  const cap = Number(env.ADV_DEFAULT_MAX_TOKENS);
  await kase(`--default-max-tokens ${cap}: requests naming no max_tokens stop at ${cap}`, async (c) => {
    const r = await post("/v1/completions", { model, prompt: "Once upon a time", ignore_eos: true, temperature: 0 });
    expectStatus(c, r, 200);
    c.expect(r.json?.usage?.completion_tokens <= cap && r.json?.choices?.[0]?.finish_reason === "length", `completion_tokens <= ${cap}, finish_reason length`, clip(r.text));
    const rc = await post("/v1/chat/completions", { model, messages: msgs, ignore_eos: true });
    expectStatus(c, rc, 200);
    c.expect(rc.json?.usage?.completion_tokens <= cap, `chat completion_tokens <= ${cap}`, clip(rc.text));
    const rs = await post("/v1/completions", { model, prompt: "Once", ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    const usage = [...rs.text.matchAll(/"completion_tokens":(\d+)/g)].map((m) => Number(m[1]));
    c.expect(rs.status === 200 && usage.length === 1 && usage[0] <= cap, `streamed completion_tokens <= ${cap}`, clip(rs.text, 600));
  });
}

await kase("TTFT of a short request while a 30,000-token prompt prefills < 2 s; closing the long one cancels it", async (c) => {
  const aborted0 = await metric("fanout_requests_aborted_total");
  const steps0 = await metric("fanout_engine_steps_total");
  const seed = Date.now() % 50_000;
  const ids = Array.from({ length: 30_000 }, (_, i) => 1000 + ((seed + i * 7919) % 120_000));
  const longBody = JSON.stringify({ model, prompt: ids, max_tokens: 2000, ignore_eos: true, stream: true });
  const long = net.connect({ host: HOST, port: PORT });
  let longGot = "";
  long.on("data", (d) => (longGot += d));
  long.on("error", () => {});
  await new Promise((r) => long.on("connect", r));
  long.write(rawPost("/v1/completions", longBody));
  // Prefilling: the long request is running and the engine has stepped at least once since.
  let running = 0, steps = steps0;
  const tw = performance.now();
  while (performance.now() - tw < 8000) {
    running = await metric("fanout_running_sequences");
    steps = await metric("fanout_engine_steps_total");
    if (running >= 1 && steps > steps0) break;
    await sleep(50);
  }
  c.expect(running >= 1, "the long request running (fanout_running_sequences >= 1)", `${running} (steps ${steps0} -> ${steps})`);
  // A short one, streamed: the time to its first token.
  const short = async (timeoutMs) => {
    const t0 = performance.now();
    let ttft = null, status = 0, text = "";
    try {
      const res = await fetch(base + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, signal: AbortSignal.timeout(timeoutMs),
        body: JSON.stringify({ model, prompt: "Hi", max_tokens: 2, temperature: 0, ignore_eos: true, stream: true }) });
      status = res.status;
      const rd = res.body.getReader();
      const dec = new TextDecoder();
      for (;;) {
        const { value, done } = await rd.read();
        if (done) break;
        text += dec.decode(value);
        if (ttft === null && /^data: /m.test(text)) ttft = performance.now() - t0;
      }
    } catch (e) { text += ` (${e})`; }
    return { ttft, status, text };
  };
  const at1 = (performance.now() - tw) / 1000;
  const s1 = await short(30_000);
  const h = await health();
  info(`TTFT of a short request while a 30,000-token prompt prefills (sent ${at1.toFixed(1)} s after it, its first chunk done): ${s1.ttft?.toFixed(0)} ms (status ${s1.status}; /health ${h.ms.toFixed(0)} ms meanwhile)`);
  c.expect(s1.status === 200 && s1.ttft !== null && s1.ttft < 2000, "the first token within 2 s", `status ${s1.status}, TTFT ${s1.ttft?.toFixed(0)} ms: ${clip(s1.text)}`);
  c.expect(h.status === 200 && h.ms < 1000, "GET /health within 1 s during the prefill", `${h.status} in ${h.ms.toFixed(0)} ms`);
  // Later in the prefill each step costs more (attention over a longer context): reported, not judged.
  await sleep(3000);
  const at2 = (performance.now() - tw) / 1000;
  const s2 = await short(20_000);
  info(`TTFT of a short request sent ${at2.toFixed(1)} s into the prefill: ${s2.ttft?.toFixed(0) ?? "none within 20 s"} ms (status ${s2.status}; engine steps since the long request: ${(await metric("fanout_engine_steps_total")) - steps0})`);
  c.expect(!/^data: /m.test(longGot), "the long request still prefilling (no token yet) when closed", clip(longGot));
  // Close it: the engine must abort it (after at most the step in progress), and not before.
  const abortedBeforeClose = await metric("fanout_requests_aborted_total");
  const runningBeforeClose = await metric("fanout_running_sequences");
  c.expect(abortedBeforeClose === aborted0 && runningBeforeClose >= 1, "the long request still running, not aborted, until its client closes",
    `aborted ${aborted0} -> ${abortedBeforeClose}, running ${runningBeforeClose}`);
  const tc = performance.now();
  long.destroy();
  let aborted = aborted0;
  while (performance.now() - tc < 30_000) {
    aborted = await metric("fanout_requests_aborted_total");
    if (aborted > aborted0 && (await metric("fanout_running_sequences")) === 0) break;
    await sleep(100);
  }
  info(`the closed 30,000-token request aborted ${(performance.now() - tc).toFixed(0)} ms after the close`);
  c.expect(aborted > aborted0, "fanout_requests_aborted_total to increase once the long request's client closes", `${aborted0} -> ${aborted}`);
}, { completion: true });

// === 5. Injection and cross-site ===============================================================
if (env.ADV_EVIL_BASE) {
  const evil = env.ADV_EVIL_BASE.replace(/\/$/, ""), evilName = env.ADV_EVIL_NAME;
  await kase(`--served-model-name ${JSON.stringify(evilName)}: /metrics lines are all comments or fanout_ samples, the label escaped`, async (c) => {
    const done = await post("/v1/completions", { model: evilName, prompt: "x", max_tokens: 1 }, { b: evil });
    expectStatus(c, done, 200);
    const m = await req("GET", "/metrics", { b: evil });
    expectStatus(c, m, 200);
    const lines = m.text.split("\n").filter((l) => l !== "");
    const stray = lines.filter((l) => !(l.startsWith("#") || l.startsWith("fanout_")));
    c.expect(stray.length === 0, "every line to start with # or fanout_", JSON.stringify(stray.slice(0, 3)));
    const sample = /^fanout_[a-z0-9_]+(?:\{model="((?:[^"\\\n]|\\["\\n])*)"(?:,(?:le|phase)="(?:[^"\\\n]|\\["\\n])*")?\})? (\S+)$/;
    const bad = lines.filter((l) => !l.startsWith("#")).filter((l) => {
      const s = sample.exec(l);
      return !s || s[1].replace(/\\(["\\n])/g, (_, ch) => (ch === "n" ? "\n" : ch)) !== evilName || Number.isNaN(Number(s[2]));
    });
    c.expect(bad.length === 0, `every sample line name{model="<escaped ${JSON.stringify(evilName)}>"} value`, JSON.stringify(bad.slice(0, 3)));
    const models = await req("GET", "/v1/models", { b: evil });
    c.expect(models.json?.data?.[0]?.id === evilName, `/v1/models id ${JSON.stringify(evilName)}`, clip(models.text));
  }, { base: evil, model: evilName });
}

await kase("Host: attacker.example -> 400 naming --allowed-hosts (GET and POST)", async (c) => {
  const r = await raw([`GET /v1/models HTTP/1.1\r\nHost: attacker.example\r\n\r\n`]);
  expectStatus(c, r, 400, { msg: /--allowed-hosts/ });
  const body = JSON.stringify({ model, prompt: "x", max_tokens: 1 });
  const rp = await raw([`POST /v1/completions HTTP/1.1\r\nHost: attacker.example:${PORT}\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`]);
  expectStatus(c, rp, 400, { msg: /--allowed-hosts/ });
});
await kase("Host family: rebinding look-alikes, two Host headers and HTTP/1.1 without Host -> 400", async (c) => {
  for (const host of ["localhost.attacker.example", "127.0.0.1.nip.io", "attacker.example:80@127.0.0.1", "", "[::1", "[::1]x"]) {
    const r = await raw([`GET /health HTTP/1.1\r\nHost: ${host}\r\n\r\n`]);
    if (!expectStatus(c, r, 400)) c.fails.push(`(Host: ${JSON.stringify(host)})`);
  }
  const two = await raw([`GET /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\nHost: attacker.example\r\n\r\n`]);
  expectStatus(c, two, 400);
  const none = await raw([`GET /health HTTP/1.1\r\n\r\n`]);
  expectStatus(c, none, 400);
});
await kase("Host family: localhost, 127.0.0.1, [::1] and a trailing dot are accepted", async (c) => {
  for (const host of [`localhost:${PORT}`, `LOCALHOST`, `127.0.0.1:${PORT}`, `[::1]:${PORT}`, `localhost.:${PORT}`, HOSTHDR]) {
    const r = await raw([`GET /health HTTP/1.1\r\nHost: ${host}\r\n\r\n`]);
    if (!expectStatus(c, r, 200)) c.fails.push(`(Host: ${host})`);
  }
});
if (env.ADV_ALT_BASE) {
  const alt = env.ADV_ALT_BASE.replace(/\/$/, "");
  const altUrl = new URL(alt);
  await kase("a server with --allowed-hosts attacker.example -> 200 for that Host, still 400 for others", async (c) => {
    const rawAlt = (bytes) => new Promise((resolve) => {
      const s = net.connect({ host: altUrl.hostname, port: Number(altUrl.port) });
      let buf = Buffer.alloc(0);
      const t = setTimeout(() => s.destroy(), 3000);
      s.on("connect", () => s.write(bytes));
      s.on("data", (d) => { buf = Buffer.concat([buf, d]); const p = parseResponses(buf); if (p.finals[0]?.complete) s.destroy(); });
      s.on("error", () => {});
      s.on("close", () => { clearTimeout(t); const p = parseResponses(buf); const f = p.finals[0]; let json = null; try { json = JSON.parse(f?.body); } catch {} resolve({ status: f?.status ?? 0, text: f?.body ?? "(none)", json }); });
    });
    for (const host of ["attacker.example", `ATTACKER.example:${altUrl.port}`]) {
      const r = await rawAlt(`GET /v1/models HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
      if (!expectStatus(c, r, 200)) c.fails.push(`(Host: ${host})`);
    }
    const body = JSON.stringify({ model: env.ADV_ALT_NAME, prompt: "x", max_tokens: 1 });
    const rp = await rawAlt(`POST /v1/completions HTTP/1.1\r\nHost: attacker.example\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`);
    expectStatus(c, rp, 200);
    const other = await rawAlt(`GET /v1/models HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n`);
    expectStatus(c, other, 400, { msg: /--allowed-hosts/ });
  }, { base: alt, model: env.ADV_ALT_NAME });
  await kase("--model DIR/ (trailing slash) serves the folder's name", async (c) => {
    const r = await req("GET", "/v1/models", { b: alt });
    c.expect(r.status === 200 && r.json?.data?.[0]?.id === env.ADV_ALT_NAME, `/v1/models id ${JSON.stringify(env.ADV_ALT_NAME)}`, clip(r.text));
    const tiny = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 1 }, { b: alt });
    expectStatus(c, tiny, 404, { msg: new RegExp(env.ADV_ALT_NAME) });
  }, { base: alt, model: env.ADV_ALT_NAME, completion: true });
}

await kase("POST with Content-Type text/plain, none, form-urlencoded, multipart -> 415 (both routes)", async (c) => {
  const body = JSON.stringify({ model, messages: msgs, prompt: "x", max_tokens: 1 });
  for (const path of ["/v1/chat/completions", "/v1/completions"]) {
    for (const ct of ["text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp", null]) {
      const r = await raw([`POST ${path} HTTP/1.1\r\nHost: ${HOSTHDR}\r\n${ct === null ? "" : `Content-Type: ${ct}\r\n`}Content-Length: ${body.length}\r\n\r\n${body}`]);
      if (!expectStatus(c, r, 415, { msg: /application\/json/ })) c.fails.push(`(${path}, Content-Type ${ct})`);
    }
  }
  const f = await post("/v1/chat/completions", JSON.stringify({ model, messages: msgs, max_tokens: 1 }), { headers: { "content-type": "text/plain" } });
  expectStatus(c, f, 415);
});
await kase("Content-Type application/json; charset=utf-8 and Application/JSON are accepted", async (c) => {
  for (const ct of ["application/json; charset=utf-8", "Application/JSON"]) {
    const r = await post("/v1/completions", { model, prompt: "x", max_tokens: 1 }, { headers: { "content-type": ct } });
    if (!expectStatus(c, r, 200)) c.fails.push(`(Content-Type ${ct})`);
  }
});

// === 6. Input that used to be accepted silently ================================================
const chat = (extra) => ({ model, messages: msgs, max_tokens: 1, ...extra });
const validation = [
  ["top_logprobs: -3", "/v1/chat/completions", chat({ top_logprobs: -3 }), "top_logprobs"],
  ["top_logprobs: 21", "/v1/chat/completions", chat({ top_logprobs: 21 }), "top_logprobs"],
  ["top_logprobs: \"1\"", "/v1/chat/completions", chat({ top_logprobs: "1" }), "top_logprobs"],
  ["top_logprobs: 2 (logprobs not implemented)", "/v1/chat/completions", chat({ top_logprobs: 2 }), "top_logprobs"],
  ["tool_choice: \"required\" without tools", "/v1/chat/completions", chat({ tool_choice: "required" }), "tool_choice"],
  ["tool_choice: a named function without tools", "/v1/chat/completions", chat({ tool_choice: { type: "function", function: { name: "f" } } }), "tool_choice"],
  ["tool_choice: 5", "/v1/chat/completions", chat({ tool_choice: 5 }), "tool_choice"],
  ["user: 5", "/v1/chat/completions", chat({ user: 5 }), "user"],
  ["user: {} (completions)", "/v1/completions", { model, prompt: "x", max_tokens: 1, user: {} }, "user"],
  ["parallel_tool_calls: \"x\"", "/v1/chat/completions", chat({ parallel_tool_calls: "x" }), "parallel_tool_calls"],
  ["parallel_tool_calls: 1", "/v1/chat/completions", chat({ parallel_tool_calls: 1 }), "parallel_tool_calls"],
  ["logit_bias value 101", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { 5: 101 } }, "logit_bias"],
  ["logit_bias value -100.5", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { 5: -100.5 } }, "logit_bias"],
  ["logit_bias value \"5\"", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { 5: "5" } }, "logit_bias"],
  ["logit_bias key \"abc\"", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { abc: 1 } }, "logit_bias"],
  ["logit_bias key \"-1\"", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { "-1": 1 } }, "logit_bias"],
  ["logit_bias key \"1e3\"", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { "1e3": 1 } }, "logit_bias"],
  ["logit_bias key \"\"", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { "": 1 } }, "logit_bias"],
  ["logit_bias key past the vocabulary", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { 99999999: 1 } }, "logit_bias"],
  ["logit_bias key 2^64", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { "18446744073709551616": 1 } }, "logit_bias"],
  ["logit_bias an array", "/v1/chat/completions", chat({ logit_bias: [1, 2] }), "logit_bias"],
  ["logit_bias with 301 entries", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: Object.fromEntries(Array.from({ length: 301 }, (_, i) => [String(i + 10), 1])) }, "logit_bias"],
  ["logit_bias naming a token twice (\"5\" and \"05\")", "/v1/completions", { model, prompt: "x", max_tokens: 1, logit_bias: { 5: 1, "05": 2 } }, "logit_bias"],
];
for (const [what, path, body, param] of validation) {
  await kase(`${what} -> 400 naming the field`, async (c) => {
    const r = await post(path, body);
    expectStatus(c, r, 400, { param });
  });
}
await kase("neutral values stay accepted: top_logprobs 0, tool_choice none/auto, user string, parallel_tool_calls true", async (c) => {
  for (const extra of [{ top_logprobs: 0 }, { tool_choice: "none" }, { tool_choice: "auto" }, { user: "u-1" }, { parallel_tool_calls: true }, { logit_bias: {} }]) {
    const r = await post("/v1/chat/completions", chat(extra));
    if (!expectStatus(c, r, 200)) c.fails.push(`(with ${JSON.stringify(extra)})`);
  }
});
await kase("NUL bytes: after the JSON body, inside a string, in a key -> 400", async (c) => {
  const good = JSON.stringify({ model, prompt: "x", max_tokens: 1 });
  for (const body of [good + "\0", good.replace('"x"', '"x\0y"'), good.replace('"prompt"', '"pro\0mpt"'), "\0" + good]) {
    const r = await post("/v1/completions", Buffer.from(body, "latin1"));
    if (!expectStatus(c, r, 400, { msg: /NUL|not valid JSON/ })) c.fails.push(`(body ${JSON.stringify(body.slice(0, 60))})`);
  }
});
await kase("logit_bias is applied: +100 on one token makes greedy decoding repeat it", async (c) => {
  const id = Number(env.ADV_TOKEN_ID || 33310), text = env.ADV_TOKEN_TEXT ?? "hello";
  const body = { model, prompt: [0, 1000, 2000, 3000], logit_bias: { [id]: 100 }, temperature: 0, max_tokens: 5, ignore_eos: true };
  const r = await post("/v1/completions", body);
  expectStatus(c, r, 200);
  c.expect(r.json?.choices?.[0]?.text === text.repeat(5), `text ${JSON.stringify(text.repeat(5))}`, clip(r.text));
  // The same request without the bias decodes something else; with -100 on the token the unbiased
  // greedy text comes back unchanged when that token was not chosen anyway.
  const plain = await post("/v1/completions", { ...body, logit_bias: undefined });
  expectStatus(c, plain, 200);
  c.expect(plain.json?.choices?.[0]?.text !== text.repeat(5), "unbiased greedy text different from the biased one", clip(plain.text));
  const chatR = await post("/v1/chat/completions", { model, messages: msgs, logit_bias: { [id]: 100 }, temperature: 0, max_tokens: 3, ignore_eos: true });
  c.expect(chatR.json?.choices?.[0]?.message?.content === text.repeat(3), `chat text ${JSON.stringify(text.repeat(3))}`, clip(chatR.text));
  const stream = await post("/v1/completions", { ...body, stream: true });
  const streamed = [...stream.text.matchAll(/^data: (\{.*\})$/gm)].map((m) => JSON.parse(m[1]).choices?.[0]?.text ?? "").join("");
  c.expect(streamed === text.repeat(5), `streamed text ${JSON.stringify(text.repeat(5))}`, clip(stream.text));
}, { completion: true });
if (env.ADV_GREEDY_ID) {
  await kase("logit_bias -100 bans the greedy choice", async (c) => {
    // ADV_GREEDY_ID: the first token `fanout generate` picks greedily after [0, 1000, 2000, 3000].
    const body = { model, prompt: [0, 1000, 2000, 3000], temperature: 0, max_tokens: 3, ignore_eos: true };
    const plain = await post("/v1/completions", body);
    const banned = await post("/v1/completions", { ...body, logit_bias: { [env.ADV_GREEDY_ID]: -100 } });
    expectStatus(c, banned, 200);
    const p = plain.json?.choices?.[0]?.text, b = banned.json?.choices?.[0]?.text;
    c.expect(typeof p === "string" && typeof b === "string" && p !== b, "a different text once the greedy first token is banned", `${JSON.stringify(b)} vs unbiased ${JSON.stringify(p)}`);
    const other = await post("/v1/completions", { ...body, logit_bias: { "7": -100 } });
    c.expect(other.json?.choices?.[0]?.text === p, "the same text when an unchosen token is banned", `${clip(other.text)} vs ${JSON.stringify(p)}`);
  });
}

// === 7. Small things ===========================================================================
await kase("HEAD /health -> 200 with Content-Length and no body", async (c) => {
  const r = await raw([`HEAD /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`], { heads: [true], settleMs: 300 });
  expectStatus(c, r, 200);
  c.expect(Number(r.headers["content-length"]) > 0, "a Content-Length header (the GET body's length)", r.finals[0]?.head);
  c.expect(r.rest.length === 0, "no body bytes after the head", JSON.stringify(r.rest.toString("latin1")));
  // And the connection stays usable: HEAD then GET on one connection.
  const two = await raw([`HEAD /v1/models HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\nGET /health HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`], { responses: 2, heads: [true, false], settleMs: 200 });
  c.expect(two.finals.length === 2 && two.finals[0].status === 200 && two.finals[1].status === 200 && /"ok"/.test(two.finals[1].body),
    "HEAD /v1/models then GET /health on one connection: 200, 200 {status: ok}", clip(two.raw.toString("latin1"), 600));
});
await kase("wrong methods -> 405 with Allow", async (c) => {
  for (const [method, path, allow] of [["GET", "/v1/completions", /^POST$/], ["GET", "/v1/chat/completions", /^POST$/], ["DELETE", "/health", /GET/], ["POST", "/v1/models", /GET/], ["PUT", "/metrics", /GET/]]) {
    const r = await req(method, path, method === "GET" || method === "DELETE" ? {} : { body: "{}" });
    if (!expectStatus(c, r, 405)) c.fails.push(`(${method} ${path})`);
    c.expect(allow.test(r.headers.get("allow") ?? ""), `${method} ${path}: an Allow header matching ${allow}`, `Allow: ${r.headers.get("allow")}`);
  }
});
await kase("Range: bytes=0-3 on /v1/models -> 200 with the whole body", async (c) => {
  const r = await req("GET", "/v1/models", { headers: { range: "bytes=0-3" } });
  expectStatus(c, r, 200);
  c.expect(r.json?.data?.[0]?.id === model && !r.headers.get("content-range"), "the whole JSON body, no Content-Range", `${r.headers.get("content-range")} ${clip(r.text)}`);
  const r2 = await req("GET", "/health", { headers: { range: "bytes=-1" } });
  c.expect(r2.status === 200 && r2.json?.status === "ok", "/health whole with Range: bytes=-1", `${r2.status} ${r2.text}`);
});
await kase("unknown routes -> 404 (and traversal-looking paths)", async (c) => {
  for (const path of ["/v2/nothing", "/v1/embeddings", "/../../etc/passwd", "/v1/models/../../etc/passwd", "//health", "/health/", "/%68ealth"]) {
    const r = await raw([`GET ${path} HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`]);
    if (!expectStatus(c, r, [404, 400])) c.fails.push(`(GET ${path})`);
  }
  const r = await req("GET", "/v2/nothing");
  expectStatus(c, r, 404);
  const q = await req("GET", "/health?x=1");
  c.expect(q.status === 200, "GET /health?x=1 -> 200 (the query is not part of the route)", `${q.status} ${q.text}`);
});
await kase("HTTP/1.0 without Host -> 200", async (c) => {
  const r = await raw([`GET /health HTTP/1.0\r\n\r\n`]);
  expectStatus(c, r, 200);
  const body = JSON.stringify({ model, prompt: "x", max_tokens: 2, ignore_eos: true, stream: true });
  const s = await raw([`POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`], { timeoutMs: 5000 });
  c.expect(s.status === 200 && s.closed && /data: \[DONE\]/.test(s.raw.toString()), "an HTTP/1.0 stream: 200, the events, [DONE], then the connection closed", clip(s.raw.toString(), 500));
});
await kase("pipelined requests on one connection -> one response each, in order", async (c) => {
  const g = (p) => `GET ${p} HTTP/1.1\r\nHost: ${HOSTHDR}\r\n\r\n`;
  const r = await raw([g("/health") + g("/v1/models")], { responses: 2, settleMs: 200 });
  c.expect(r.finals.length === 2 && r.finals[0].status === 200 && /"ok"/.test(r.finals[0].body) && /"data"/.test(r.finals[1].body),
    "two responses: /health then /v1/models", clip(r.raw.toString("latin1"), 600));
  const body = JSON.stringify({ model, prompt: "x", max_tokens: 2, temperature: 0, ignore_eos: true });
  const r3 = await raw([rawPost("/v1/completions", body) + g("/health") + g("/nothing")], { responses: 3, settleMs: 200 });
  const st = r3.finals.map((x) => x.status);
  c.expect(JSON.stringify(st) === "[200,200,404]" && /text_completion/.test(r3.finals[0].body) && /"ok"/.test(r3.finals[1].body),
    "a completion, /health, then a 404, in order", `${JSON.stringify(st)} ${clip(r3.raw.toString("latin1"), 600)}`);
  const sb = JSON.stringify({ model, prompt: "x", max_tokens: 2, ignore_eos: true, stream: true });
  const r4 = await raw([rawPost("/v1/completions", sb) + g("/health")], { responses: 2, settleMs: 200 });
  c.expect(r4.finals.length === 2 && /\[DONE\]/.test(r4.finals[0].body) && r4.finals[1].status === 200,
    "a streamed completion then /health", clip(r4.raw.toString("latin1"), 600));
});
await kase("Expect: 100-continue -> 100 Continue, then the answer", async (c) => {
  const body = JSON.stringify({ model, prompt: "x", max_tokens: 2, temperature: 0, ignore_eos: true });
  const r = await new Promise((resolve) => {
    const s = net.connect({ host: HOST, port: PORT });
    let buf = Buffer.alloc(0), sentBody = false, sawContinue = false;
    const t = setTimeout(() => s.destroy(), 5000);
    s.on("connect", () => s.write(jsonHead("/v1/completions", body.length, "Expect: 100-continue\r\n")));
    s.on("data", (d) => {
      buf = Buffer.concat([buf, d]);
      const p = parseResponses(buf);
      if (!sentBody && p.interim.some((x) => x.status === 100)) { sawContinue = true; sentBody = true; s.write(body); }
      if (p.finals[0]?.complete) s.destroy();
    });
    s.on("error", () => {});
    s.on("close", () => { clearTimeout(t); resolve({ sawContinue, ...parseResponses(buf), raw: buf.toString("latin1") }); });
  });
  c.expect(r.sawContinue, "HTTP/1.1 100 Continue before the body is sent", clip(r.raw));
  c.expect(r.finals[0]?.status === 200 && /text_completion/.test(r.finals[0]?.body), "then 200 with the completion", clip(r.raw));
});
await kase("a client that disconnects mid-stream has its request aborted", async (c) => {
  const a0 = await metric("fanout_requests_aborted_total");
  const body = JSON.stringify({ model, prompt: "Tell me a story", max_tokens: 3000, ignore_eos: true, stream: true });
  await new Promise((resolve) => {
    const s = net.connect({ host: HOST, port: PORT });
    const t = setTimeout(() => { s.destroy(); resolve(); }, 5000);
    let got = "";
    s.on("connect", () => s.write(rawPost("/v1/completions", body)));
    s.on("data", (d) => { got += d; if (/^data: /m.test(got)) { clearTimeout(t); s.destroy(); resolve(); } });
    s.on("error", () => {});
  });
  let a = a0;
  for (let k = 0; k < 50 && a <= a0; k++) { await sleep(100); a = await metric("fanout_requests_aborted_total"); }
  c.expect(a > a0, "fanout_requests_aborted_total to increase within 5 s", `${a0} -> ${a}`);
});
await kase("a client that disconnects while waiting for a whole (non-streamed) response has its request aborted", async (c) => {
  const a0 = await metric("fanout_requests_aborted_total");
  const body = JSON.stringify({ model, prompt: "Tell me a story", max_tokens: 3000, ignore_eos: true });
  const s = net.connect({ host: HOST, port: PORT });
  s.on("error", () => {});
  await new Promise((r) => s.on("connect", r));
  s.write(rawPost("/v1/completions", body));
  await sleep(500);
  s.destroy();
  let a = a0;
  for (let k = 0; k < 50 && a <= a0; k++) { await sleep(100); a = await metric("fanout_requests_aborted_total"); }
  c.expect(a > a0, "fanout_requests_aborted_total to increase within 5 s", `${a0} -> ${a}`);
  let running = NaN;
  for (let k = 0; k < 30; k++) { running = await metric("fanout_running_sequences"); if (running === 0) break; await sleep(100); }
  c.expect(running === 0, "nothing left running (fanout_running_sequences 0 within 3 s)", running);
}, { completion: true });

// === The deadlines, judged last =================================================================
await kase("header deadline: a head trickled a byte a second is cut off at ~10 s", async (c) => {
  while (headerProbe.closedAfterMs === null && Date.now() - headerProbe.t0 < 15_000) await sleep(100);
  const t = headerProbe.closedAfterMs;
  c.expect(t !== null && t >= 9000 && t <= 13_000, "the connection closed by the server 10 s (9-13 s) after it opened", t === null ? "still open after 15 s" : `${t} ms`);
  c.expect(headerProbe.got === "" || /^HTTP\/1\.1 408/.test(headerProbe.got), "nothing, or a 408", clip(headerProbe.got));
  headerProbe.destroy();
});
await kase("body deadline: a body that stops coming is cut off at ~30 s", async (c) => {
  while (bodyProbe.closedAfterMs === null && Date.now() - bodyProbe.t0 < 34_000) await sleep(100);
  const t = bodyProbe.closedAfterMs;
  c.expect(t !== null && t >= 29_000 && t <= 34_000, "the connection closed by the server 30 s (29-34 s) after the head", t === null ? "still open after 34 s" : `${t} ms`);
  c.expect(bodyProbe.got === "" || /^HTTP\/1\.1 408/.test(bodyProbe.got), "nothing, or a 408", clip(bodyProbe.got));
  bodyProbe.destroy();
});

info(`suite took ${((Date.now() - suiteStart) / 1000).toFixed(1)} s`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed === 0 ? 0 : 1);
