#!/usr/bin/env bash
# Nsight Compute on the tile kernel at M = 4096 (kv_b, K = 512, 128x256/1c2), built with -lineinfo: where
# a tile's fixed cost goes (source/SASS view with stall samples, and the details page).
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build
S=$OUT/summary.txt
t0=$(date +%s)
timeout 240 ncu --kernel-name regex:gemm_fp8_sm90_kernel --launch-skip 3 --launch-count 1 --set full --import-source yes \
  -o $OUT/prof $B/apps/fanout_li bench kernels --no-grouped --shape kv_b --m 4096 --config 128x256/1c2 --json '' > $OUT/ncu_run.txt 2>&1
echo "ncu rc=$? t=$(( $(date +%s) - t0 ))" >> $S
ncu --import $OUT/prof.ncu-rep --page details --csv > $OUT/details.csv 2> $OUT/details.err; echo "details rc=$?" >> $S
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source sass > $OUT/source_sass.csv 2> $OUT/source.err; echo "source rc=$? $(wc -c < $OUT/source_sass.csv)" >> $S
ncu --import $OUT/prof.ncu-rep --page source --csv --print-source cuda,sass > $OUT/source_cuda.csv 2> $OUT/source2.err; echo "source2 rc=$? $(wc -c < $OUT/source_cuda.csv)" >> $S
gzip -9 $OUT/*.csv
ls -la $OUT >> $S
cat $S
