#!/usr/bin/env bash
# Runs on the GPU machine: every kernel of one V3-width layer step (dense and MoE, EP8 emulated)
# under Nsight Compute, one line each — name, grid, block, duration — to see where the layer's
# small-kernel tail goes (issue 19, item 5). BATCHES (default "1,128") per GPU.
#   bash scripts/gpu_tail_profile.sh .carry/build   (writes $OUT/tail_*.csv)
set -uo pipefail
build=${1:-.carry/build}
out=${OUT:-/tmp/tail_profile}
mkdir -p "$out"
BATCHES=${BATCHES:-1,128}
cuda_lib=$(ls -d /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-13*/targets/x86_64-linux/lib 2>/dev/null | head -1)
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
export LD_LIBRARY_PATH=$PWD/.carry/lib:$cuda_lib:$nccl_lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1
for b in ${BATCHES//,/ }; do
    ncu --clock-control none --csv --print-units base -c 600 \
        --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread,dram__bytes.sum \
        "$build/apps/fanout" bench layer --batches "$b" --eps 8 --replays 1 --json '' > "$out/tail_b$b.csv" 2> "$out/tail_b$b.err"
    python3 - "$out/tail_b$b.csv" "$b" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
hdr = rows[0]; rows = rows[1:]
ki, mi, vi, idi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value"), hdr.index("ID")
num = lambda s: float(str(s).replace(",", "") or 0)
k = collections.OrderedDict()
for r in rows:
    k.setdefault(r[idi], {"name": r[ki]})[r[mi]] = r[vi]
print(f"=== batch {sys.argv[2]}: {len(k)} launches")
for i, d in k.items():
    print(f"{i:>4} {num(d.get('gpu__time_duration.sum', 0))/1e3:8.2f} us  grid {d.get('launch__grid_size',''):>6} "
          f"block {d.get('launch__block_size',''):>4} regs {d.get('launch__registers_per_thread',''):>3} "
          f"dram {num(d.get('dram__bytes.sum', 0))/1e6:7.2f} MB  {d['name'][:90]}")
PY
done
