#!/usr/bin/env bash
# Runs on the GPU machine: Nsight Compute on single launches of the FP8 GEMM, one per
#   "SHAPE|M|CONFIG" argument (e.g. "o_proj|4096|128x256/1"), through `fanout bench kernels`.
# Reports go to $OUT/ncu_<n>.txt; the key lines are printed.
set -uo pipefail
build=${BUILD:-.carry/build}
out=${OUT:-/tmp/gpu_profile_out}
mkdir -p "$out"
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:${LD_LIBRARY_PATH:-}
n=0
for spec in "$@"; do
    IFS='|' read -r shape m config <<< "$spec"
    n=$((n + 1))
    echo "=== $shape M=$m $config"
    ncu --clock-control none -k regex:gemm_fp8_sm90 -c 1 \
        --section LaunchStats --section Occupancy --section SpeedOfLight --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section WarpStateStats --section SourceCounters \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        "$build/apps/fanout" bench kernels --no-grouped --shape "$shape" --m "$m" --config "$config" --json '' \
        > "$out/ncu_$n.txt" 2>&1
    grep -E "Grid Size|Cluster Size|Duration|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Max Active Clusters|Issue Slots Busy|Executed Ipc" "$out/ncu_$n.txt" | head -20
    # Stall reasons (cycles per issued instruction), largest first, and the hottest stall sites.
    grep -E "issue_stalled" "$out/ncu_$n.txt" | awk '{print $NF, $1}' | sort -rn | head -8
    sed -n '/Warp Stall Sampling/,+14p' "$out/ncu_$n.txt" | head -30
done
