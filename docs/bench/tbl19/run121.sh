#!/usr/bin/env bash
# Twenty-fourth session, the session's code (run121: one H100, 0abeac6): every GPU suite (new:
# CudaCheck.AFailureIsReportedOnceByTheCallThatFailed, CudaModel.ALargeCacheIsReadyBeforeTheFirstStep,
# SamplingCuda.MatchesCpuRule with a temperature too small to divide by); item 1's and item 2's
# tables (`bench kernels`, dense and grouped); `bench mla` (head-major, the layer's layout) beside
# the layer, twice; then Nsight Compute's duration and SM clock of the MLA kernel as the layer runs
# it and as `bench mla` runs it (--clock-control none --cache-control none: the machine's own clock
# and caches), to tell whether the layer's attention is slower per cycle or per second.
set -u
source scripts/device_env.sh
gpu_suites
run_line "kernels" kernels $B/apps/fanout bench kernels --json $L/kernels.json
for i in 1 2; do
  run_line "mla b128 head-major $i" mla.hm.$i $B/apps/fanout bench mla --batches 128 --prefill '' --head-major --json $L/mla.hm.$i.json
  run_line "layer $i" layer.$i $B/apps/fanout bench layer --batches 32,128 --eps 8 --replays 10 --json $L/layer.$i.json
done
m='gpu__time_duration.sum,sm__cycles_elapsed.avg,sm__cycles_elapsed.avg.per_second'
run_line "ncu layer attention" ncu_layer timeout 110 ncu --clock-control none --cache-control none --metrics $m \
  -k regex:mla_fast --launch-count 8 $B/apps/fanout bench layer --batches 128 --eps 8 --replays 2
run_line "ncu mla attention" ncu_mla timeout 110 ncu --clock-control none --cache-control none --metrics $m \
  -k regex:mla_fast --launch-count 8 $B/apps/fanout bench mla --batches 128 --prefill '' --head-major
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
