#!/usr/bin/env bash
# Stream-K: the GEMM tests, sweeps with sk at M = 64 / 1024 / 2560, grouped points with sk variants, old-vs-new dense, SASS spill sites.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
timeout 200 $B/tests/ops/ops_cuda_test > $L/ops_cuda_test.txt 2>&1; echo "ops_cuda rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_cuda_test.txt | tr '\n' ' ')" >> $OUT/summary.txt
grep -E "^\[  FAILED  \]" $L/ops_cuda_test.txt | head -8 >> $OUT/summary.txt
for b in fanout fanout_gold; do
  timeout 90 $B/apps/$b bench kernels --no-grouped --json $L/dense_$b.json > $L/dense_$b.txt 2>&1
  echo "== dense $b rc=$?" >> $OUT/summary.txt; grep -A7 "^sum over" $L/dense_$b.txt >> $OUT/summary.txt
done
for m in 64 1024 2560; do
  timeout 150 $B/apps/fanout bench kernels --no-grouped --sweep --m $m --json $L/sweep_$m.json > $L/sweep_$m.txt 2>&1
  echo "== sweep $m rc=$?" >> $OUT/summary.txt; grep -E "^(fused|q_b|kv_b|o_proj|shared)" $L/sweep_$m.txt | cut -c1-20,100-220 >> $OUT/summary.txt
done
timeout 200 $B/apps/fanout bench kernels --no-dense --json $L/grouped.json > $L/grouped.txt 2>&1; echo "== grouped rc=$?" >> $OUT/summary.txt; grep -E "^EP|GEMMs" $L/grouped.txt >> $OUT/summary.txt
python3 - $L/grouped.json >> $OUT/summary.txt <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
rows=d.get('grouped',d) if isinstance(d,dict) else d
def walk(x):
    if isinstance(x,dict):
        if 'variants' in x: yield x
        for v in x.values(): yield from walk(v)
    elif isinstance(x,list):
        for v in x: yield from walk(v)
for r in walk(d):
    print(r.get('kind'), r.get('ep'), r.get('N'), r.get('K'), ' '.join('%s:%.1f'%(v['config'],v['us']) for v in r['variants']))
PY
if command -v cuobjdump >/dev/null || [ -x /usr/local/cuda/bin/cuobjdump ]; then
  CO=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
  $CO -sass $B/apps/fanout > /tmp/sass.txt 2>&1
  awk '/Function :/{f=$3} /STL|LDL/{if (f ~ /gemm_fp8_sm90/) {c[f]++}} END{for (k in c) print c[k], k}' /tmp/sass.txt | c++filt | sort -rn | head -30 > $L/spills.txt
  awk '/Function :/{f=$3; n=0} {if (f ~ /gemm_fp8_sm90_kernelILi128ELi256ELi4ELNS1_6LayoutE0ELi2E/) {n++; print}}' /tmp/sass.txt > $L/sass_128x256_dense_c2.txt
  awk '/Function :/{f=$3} {if (f ~ /gemm_fp8_sm90_kernelILi128ELi128E/ && f ~ /LayoutE2ELi1E/) print}' /tmp/sass.txt > $L/sass_128x128_masked.txt
  echo "== spills (STL/LDL per gemm kernel)" >> $OUT/summary.txt; cat $L/spills.txt >> $OUT/summary.txt
else echo "no cuobjdump" >> $OUT/summary.txt; fi
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
