#!/usr/bin/env bash
# Twenty-second session, one H200. Item 5 (the MoE layer at batch 128): the router's GEMM through
# cuBLASLt (gate_probe: the heuristic's algorithm against every one it offers and forced split-K
# counts); HEAD (K split where the heuristic's tiles fill under half of the GPU, device_context.cc)
# against the previous build (build/fanout_old) on the layer, alternating; the attention alone
# (`bench mla`) beside the layer in one call (the layer's attention reads 590-598 µs, `bench mla`
# 572-579 on earlier machines). Carry: HEAD's build plus build/gate_probe, build/fanout_old.
set -u
source scripts/device_env.sh
test_line ops/glue_cuda_test
test_line ops/ops_cuda_test
run_line "gate probe" gate_probe $B/gate_probe
run_line "mla b128" mla $B/apps/fanout bench mla --batches 128 --prefill '' --json $L/mla.json
for i in 1 2; do for v in new old; do
  bin=$B/apps/fanout; [ $v = old ] && bin=$B/fanout_old
  timeout 100 $bin bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$v.$i.json > $L/layer.$v.$i.txt 2>&1
  echo "layer $v $i rc=$? $(grep -E '^layer total|^gate |^topk |^attention ' $L/layer.$v.$i.txt | tr -s ' ' | tr '\n' ' ')" >> $S
done; done
run_line "mla b128 again" mla2 $B/apps/fanout bench mla --batches 128 --prefill '' --json $L/mla2.json
test_line model/model_cuda_test
echo "nsys: $(which nsys) $(ls -d /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems* 2>/dev/null | tr '\n' ' ')" >> $S
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
