#!/usr/bin/env python3
"""One `fanout bench serve` run against `fanout serve --mtp K`, summarised for issue 18's table.

usage: mtp_step_summary.py K CONCURRENCY BENCH_JSON METRICS_BEFORE METRICS_AFTER SUMMARY_JSON

Reads the bench's JSON and the server's /metrics before and after the run; appends to SUMMARY_JSON
(a list) the run's output throughput, TPOT, acceptance, and per engine step the wall time of the
model's forward (with MTP: the checking step) and of the MTP drafting passes.
"""
import json
import os
import sys


def counters(path):
    out = {}
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name.split("{")[0]] = float(value)
    return out


def main():
    k, conc, bench_path, before_path, after_path, summary_path = sys.argv[1:7]
    bench = json.load(open(bench_path))
    before, after = counters(before_path), counters(after_path)
    delta = {n: after.get(n, 0.0) - before.get(n, 0.0) for n in after}
    steps = delta.get("fanout_engine_steps_total", 0.0)
    entry = {
        "mtp": int(k),
        "concurrency": int(conc),
        "output_throughput": bench.get("output_throughput"),
        "tpot_ms_p50": bench.get("tpot_ms", {}).get("p50"),
        "mtp_acceptance_rate": bench.get("mtp_acceptance_rate"),
        "mtp_mean_accepted_length": bench.get("mtp_mean_accepted_length"),
        "steps": steps,
        "forward_ms_per_step": 1e3 * delta.get("fanout_engine_forward_seconds_total", 0.0) / steps if steps else None,
        "draft_ms_per_step": 1e3 * delta.get("fanout_spec_draft_seconds_total", 0.0) / steps if steps else None,
    }
    runs = json.load(open(summary_path)) if os.path.exists(summary_path) else []
    runs.append(entry)
    json.dump(runs, open(summary_path, "w"), indent=1)
    print("summary:", json.dumps(entry))


if __name__ == "__main__":
    main()
