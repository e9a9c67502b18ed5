#!/usr/bin/env bash
# The main job on the embedded default model: build, then generate 32 tokens from a prompt of
# token ids with `--model tiny` (made on the fly on first use). Extra arguments go to
# `fanout generate`, e.g. scripts/run_tiny.sh --temperature 0.7 --seed 1.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${BUILD_DIR:-build}/apps/fanout" generate --model tiny --prompt-ids 0,2788,3263,14,1042 --max-tokens 32 "$@"
