#!/usr/bin/env bash
# cuBLASLt's heuristic ranking: its first 16 algorithms for every dense shape and M, each timed
# from an idle pause beside the first (the one the model runs).
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build
L=$OUT/logs; mkdir -p $L
timeout 500 $B/apps/fanout bench kernels --no-grouped --lt-algos 16 --json $L/lt_algos.json > $L/lt_algos.txt 2>&1
echo "rc=$?"
cat $L/lt_algos.txt
