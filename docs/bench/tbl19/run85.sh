#!/usr/bin/env bash
# Every GPU suite on the final code (149f2da / d450dc6): the tests, the microbatch and serve checks.
# (Ran as .carry/run85.sh with its preamble inline; since the seventeenth session's review they
# come from scripts/device_env.sh, which also sets the NCCL and tokenizer variables some of these
# did not need. Run from the repository root.)
set -u
source scripts/device_env.sh
gpu_suites
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
