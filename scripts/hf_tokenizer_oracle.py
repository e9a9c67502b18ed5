#!/usr/bin/env python3
"""HF reference for the fanout tokenizer fixtures (GPU machine; offline).

Encodes each JSONL string of --corpus with tokenizers.Tokenizer.from_file(
DIR/tokenizer.json) and add_special_tokens=False, writing one compact JSON id
array per line (byte-comparable with scripts/js/tokenize.mjs output).

  python3 scripts/hf_tokenizer_oracle.py --tokenizer-dir DIR \\
      --corpus tests/fixtures/tokenizer/corpus.jsonl --out /tmp/hf_ids.jsonl \\
      [--expect tests/fixtures/tokenizer/corpus_ids.jsonl] [--bench N]
Optional, via transformers (needs DIR/tokenizer_config.json):
  --bos-out FILE    AutoTokenizer(DIR).encode(text) (add_special_tokens=True)
  --chat FILE --chat-out FILE
                    apply_chat_template(tokenize=False) of each conversation
                    ({"messages", "add_generation_prompt"} or a bare list)
--bench N times N single-threaded passes of per-line encode() and of one
encode_batch() and prints one JSON object per method.
"""
import argparse
import json
import os
import sys
import time

# Single-threaded: must be set before tokenizers starts its thread pool.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path, values):
    with open(path, "w", encoding="utf-8") as f:
        for v in values:
            f.write(json.dumps(v, ensure_ascii=False, separators=(",", ":")) + "\n")


def bench(method, fn, lines, n_bytes, n_tokens, reps):
    fn(lines)  # warm-up
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(lines)
    s = time.perf_counter() - t0
    print(json.dumps({"method": method, "bytes": n_bytes * reps, "tokens": n_tokens * reps,
                      "seconds": s, "mb_per_s": n_bytes * reps / 1e6 / s,
                      "tokens_per_s": n_tokens * reps / s}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--out")
    ap.add_argument("--expect", help="id JSONL to compare with (exit 1 on any difference)")
    ap.add_argument("--bench", type=int, default=0)
    ap.add_argument("--bos-out")
    ap.add_argument("--chat")
    ap.add_argument("--chat-out")
    a = ap.parse_args()

    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(a.tokenizer_dir, "tokenizer.json"))
    lines = read_jsonl(a.corpus)
    assert all(isinstance(s, str) for s in lines), "corpus lines must be JSON strings"
    ids = [tok.encode(s, add_special_tokens=False).ids for s in lines]
    if a.out:
        write_jsonl(a.out, ids)

    rc = 0
    if a.expect:
        want = read_jsonl(a.expect)
        bad = [i + 1 for i, (x, y) in enumerate(zip(ids, want)) if x != y]
        if len(want) != len(ids):
            print(f"line count differs: {len(ids)} vs {len(want)}", file=sys.stderr)
            rc = 1
        for i in bad:
            print(f"line {i}: {json.dumps(lines[i - 1], ensure_ascii=False)}\n"
                  f"  hf  {ids[i - 1]}\n  exp {want[i - 1]}", file=sys.stderr)
        print(f"{len(ids) - len(bad)}/{len(ids)} lines match {a.expect}", file=sys.stderr)
        rc = rc or int(bool(bad))

    if a.bench:
        n_bytes = sum(len(s.encode("utf-8")) for s in lines)
        n_tokens = sum(len(x) for x in ids)
        bench("encode", lambda ls: [tok.encode(s, add_special_tokens=False) for s in ls],
              lines, n_bytes, n_tokens, a.bench)
        bench("encode_batch", lambda ls: tok.encode_batch(ls, add_special_tokens=False),
              lines, n_bytes, n_tokens, a.bench)

    if a.bos_out or a.chat:
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(a.tokenizer_dir)
        if a.bos_out:
            write_jsonl(a.bos_out, [hf.encode(s, add_special_tokens=True) for s in lines])
        if a.chat:
            out = []
            for i, c in enumerate(read_jsonl(a.chat)):
                c = {"messages": c} if isinstance(c, list) else c
                try:
                    out.append(hf.apply_chat_template(
                        c["messages"], tokenize=False,
                        add_generation_prompt=c.get("add_generation_prompt", True)))
                except Exception as e:  # e.g. an empty messages list
                    print(f"chat line {i + 1}: {type(e).__name__}: {e}", file=sys.stderr)
                    out.append(None)
            write_jsonl(a.chat_out or "/dev/stdout", out)
    return rc


if __name__ == "__main__":
    sys.exit(main())
