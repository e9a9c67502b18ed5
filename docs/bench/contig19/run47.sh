#!/usr/bin/env bash
# bench kernels: the grouped points (masked decode, contiguous prefill) and the dense shapes at every M.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib
B=.carry/build
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $OUT/gpu.txt
timeout 200 $B/apps/fanout bench kernels --no-dense --json $OUT/kernels_grouped.json > $OUT/kernels_grouped.txt 2>&1; echo "rc=$?" >> $OUT/kernels_grouped.txt
timeout 200 $B/apps/fanout bench kernels --no-grouped --json $OUT/kernels_dense.json > $OUT/kernels_dense.txt 2>&1; echo "rc=$?" >> $OUT/kernels_dense.txt
cat $OUT/kernels_grouped.txt $OUT/kernels_dense.txt
