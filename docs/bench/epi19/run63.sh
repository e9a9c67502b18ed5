#!/usr/bin/env bash
# The tile table at M = 256 (batch 128 with MTP) as a layer runs it: cold W, calls serialized.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
t0=$(date +%s)
timeout 400 $B/apps/fanout bench kernels --no-grouped --sweep --cold --serial --m 256 --json $L/sweep_m256_cold_serial.json > $L/sweep_m256_cold_serial.txt 2>&1
echo "sweep rc=$? t=$(( $(date +%s) - t0 ))" >> $OUT/summary.txt
timeout 100 $B/apps/fanout bench kernels --no-grouped --sweep --m 256 --json $L/sweep_m256_warm.json > $L/sweep_m256_warm.txt 2>&1
echo "warm sweep rc=$? t=$(( $(date +%s) - t0 ))" >> $OUT/summary.txt
cd $OUT && tar czf logs.tgz logs && cp logs/*.txt . ; rm -rf logs
cat $OUT/summary.txt
