"""`fanout serve --device cuda` on the tiny model, checked over HTTP (gpu_check.sh runs it):
a chat request, then logit_bias on the device sampler — +100 on token 1000 (" в") forces it under
greedy decoding, -100 bans it under sampling.  Usage: gpu_serve_check.py BASE_URL"""
import json
import sys
import urllib.request as u

base = sys.argv[1]


def post(path, body):
    req = u.Request(base + path, json.dumps(body).encode(), {"content-type": "application/json"})
    return json.load(u.urlopen(req, timeout=120))


r = post("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 16})
print(r["usage"], repr(r["choices"][0]["message"]["content"]))
assert 1 <= r["usage"]["completion_tokens"] <= 16
prompt = {"model": "tiny", "prompt": [0, 5, 17, 99], "max_tokens": 5, "ignore_eos": True}
forced = post("/v1/completions", {**prompt, "temperature": 0, "logit_bias": {"1000": 100}})["choices"][0]["text"]
print("logit_bias +100 on 1000, greedy:", repr(forced))
assert forced == " в" * 5, "logit_bias +100 did not force token 1000"
banned = post("/v1/completions", {**prompt, "temperature": 0, "logit_bias": {"1000": -100}})["choices"][0]["text"]
plain = post("/v1/completions", {**prompt, "temperature": 0})["choices"][0]["text"]
print("greedy:", repr(plain), " with 1000 banned:", repr(banned))
assert " в" not in banned
print("PASS gpu serve check")
