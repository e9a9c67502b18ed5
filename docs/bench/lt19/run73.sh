#!/usr/bin/env bash
# cuBLASLt's block-scaled FP8 algorithm in every tile and cluster shape it accepts (--lt-search),
# at M = 4096 and 1024, every dense shape: tiles from 64 x 128 up, 7 cluster shapes, swizzle off and on.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build
L=$OUT/logs; mkdir -p $L
for m in 4096 1024; do
  timeout 260 $B/apps/fanout bench kernels --no-grouped --lt-search --m $m --json $L/lt_search_$m.json > $L/lt_search_$m.txt 2>&1
  echo "m=$m rc=$?"
  grep -E "^[a-z]" $L/lt_search_$m.txt | cut -c1-20,100-400
done
