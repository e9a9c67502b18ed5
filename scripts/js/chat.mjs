#!/usr/bin/env node
// Chat-template oracle: renders DeepSeek-V3's chat_template (from the bundled
// tokenizer_config.json) with @huggingface/jinja, like transformers'
// apply_chat_template.
//   node scripts/js/chat.mjs [--ids] < conversations.jsonl
// Each input line: {"messages": [...], "add_generation_prompt": bool}
// (add_generation_prompt defaults to true) or a bare messages array (true).
// Output: one JSON string (rendered text) per line, or with --ids one JSON id
// array per line (encoded without adding BOS: the template writes bos_token).
import { Template } from "@huggingface/jinja";
import { encode, readJsonl, writeJsonl, tokenizerConfig, tokenContent } from "./common.mjs";

const args = process.argv.slice(2);
const ids = args.includes("--ids");
if (args.some((a) => a !== "--ids")) {
  console.error("usage: chat.mjs [--ids] < conversations.jsonl");
  process.exit(2);
}

const template = new Template(tokenizerConfig.chat_template);
const bos_token = tokenContent(tokenizerConfig.bos_token);
const eos_token = tokenContent(tokenizerConfig.eos_token);

export function render(conv) {
  const { messages, add_generation_prompt = true } = Array.isArray(conv) ? { messages: conv } : conv;
  if (!Array.isArray(messages)) throw new Error("no messages array");
  return template.render({ messages, add_generation_prompt, bos_token, eos_token });
}

const out = readJsonl().map((conv, i) => {
  try {
    const text = render(conv);
    return ids ? encode(text, false) : text;
  } catch (e) {
    console.error(`stdin record ${i + 1}: ${e.message}`);
    process.exit(1);
  }
});
writeJsonl(out);
