#!/usr/bin/env python3
"""How a long prefill affects everyone else (docs/PERF.md, issue 14).

Starts `fanout serve --model tiny --port 0 [EXTRA ARGS]`, sends one streamed completion with a
100,000-token prompt (token ids), then every 5 s a short streamed request (8 tokens), printing its
time to first token and end-to-end time, for DURATION seconds (default 60); NOLONG=1 measures the
short requests alone. The long request is cancelled when the server stops.

    scripts/long_prompt_latency.py build/apps/fanout [--attention-cost X ...]
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

fanout, extra = sys.argv[1], sys.argv[2:]
log_path = os.path.join(tempfile.mkdtemp(), "serve.log")
with open(log_path, "w") as log:
    server = subprocess.Popen([fanout, "serve", "--model", "tiny", "--port", "0"] + extra, stderr=log, stdout=log)
port = None
for _ in range(600):
    m = re.search(r"listening on http://127.0.0.1:(\d+)", open(log_path).read())
    if m:
        port = int(m.group(1))
        break
    time.sleep(0.1)
if port is None:
    sys.exit(f"the server did not start: {open(log_path).read()}")
base = f"http://127.0.0.1:{port}"


def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    return urllib.request.urlopen(req, timeout=600)


def long_request():
    ids = [(i * 7919) % 120000 + 10 for i in range(100000)]
    try:
        post({"model": "tiny", "prompt": ids, "max_tokens": 4, "stream": True}).read()
    except Exception:
        pass  # cut off when the server stops


if not os.environ.get("NOLONG"):
    threading.Thread(target=long_request, daemon=True).start()
t0 = time.time()
try:
    while time.time() - t0 < float(os.environ.get("DURATION", "60")):
        time.sleep(5)
        t = time.time()
        first = None
        for line in post({"model": "tiny", "prompt": "hello there, how are you", "max_tokens": 8, "stream": True,
                          "ignore_eos": True}):
            if first is None and line.startswith(b"data: {") and b'"text":"' in line:
                first = time.time() - t
        print(f"at {t - t0:5.1f} s: TTFT {first * 1000:6.0f} ms, 8 tokens in {(time.time() - t) * 1000:6.0f} ms",
              flush=True)
    metrics = urllib.request.urlopen(base + "/metrics").read().decode()
    print("engine steps:", re.search(r"fanout_engine_steps_total\{[^}]*\} (\S+)", metrics).group(1))
finally:
    server.terminate()
    server.wait()
