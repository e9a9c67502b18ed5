#!/usr/bin/env bash
# Stream-K v2 (template flag, shared-memory plan, data-parallel waves first): GEMM tests, grouped + dense new vs gold, sweeps at 2560 / 64.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
B=.carry/build
L=$OUT/logs; mkdir -p $L
timeout 200 $B/tests/ops/ops_cuda_test > $L/ops_cuda_test.txt 2>&1; echo "ops_cuda rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_cuda_test.txt | tr '\n' ' ')" >> $OUT/summary.txt
grep -E "^\[  FAILED  \]" $L/ops_cuda_test.txt | head -8 >> $OUT/summary.txt
for b in fanout fanout_gold fanout; do
  timeout 200 $B/apps/$b bench kernels --no-dense --json $L/grouped_$b.json > $L/grouped_$b.txt 2>&1; echo "== grouped $b rc=$?" >> $OUT/summary.txt; grep -E "^EP|GEMMs" $L/grouped_$b.txt | cut -c1-80,150-200 >> $OUT/summary.txt
done
python3 - $L/grouped_fanout.json >> $OUT/summary.txt <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
def walk(x):
    if isinstance(x,dict):
        if 'variants' in x: yield x
        for v in x.values(): yield from walk(v)
    elif isinstance(x,list):
        for v in x: yield from walk(v)
for r in walk(d):
    print(r.get('kind'), r.get('ep'), r.get('N'), r.get('K'), 'table %.1f'%r['fanout']['us'], ' '.join('%s:%.1f'%(v['config'],v['us']) for v in r['variants']))
PY
for b in fanout_gold fanout; do
  timeout 90 $B/apps/$b bench kernels --no-grouped --json $L/dense_$b.json > $L/dense_$b.txt 2>&1
  echo "== dense $b rc=$?" >> $OUT/summary.txt; grep -A7 "^sum over" $L/dense_$b.txt >> $OUT/summary.txt
done
for s in "shared gate+up" "shared down" "o_proj" "fused qkv_a"; do
  for m in 2560 1024 64; do
    f=$L/sweep_${m}_$(echo $s | tr ' +' '__').json
    timeout 60 $B/apps/fanout bench kernels --no-grouped --sweep --shape "$s" --m $m --json $f > ${f%.json}.txt 2>&1
    python3 - $f >> $OUT/summary.txt <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))['dense']
for rr in [v for v in d.values() if isinstance(v,list)]:
  for r in rr:
    if 'sweep' not in r: continue
    s=sorted(r['sweep'],key=lambda x:x['us'])
    sk=[x for x in s if '/sk' in x['config']][:3]
    print(r['M'], r['shape'][:10], 'lt %.1f'%r['cublaslt_us'], 'table %.1f'%r['fanout']['us'], ' '.join('%s:%.1f'%(x['config'],x['us']) for x in s[:4]), '| sk:', ' '.join('%s:%.1f'%(x['config'],x['us']) for x in sk))
PY
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
