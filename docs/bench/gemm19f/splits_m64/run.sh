#!/usr/bin/env bash
# M=64 splits the sweep does not try (3, 5, 6, 7), warm and cold+serial.
set -u
cd "$(dirname "$0")/.."
tar xJf .carry/build.tar.xz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/targets/x86_64-linux/lib:$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib)
B=.carry/build; L=$OUT/logs; mkdir -p $L
run() { # shape config mode...
  local sh="$1" cfg="$2"; shift 2
  local tag=$(echo "$sh-$cfg-$*" | tr ' /+' '__p')
  timeout 30 $B/apps/fanout bench kernels --no-grouped --shape "$sh" --m 64 --config $cfg "$@" --json '' > $L/$tag.txt 2>&1
  echo "$sh $cfg $* : $(grep -F "$sh" $L/$tag.txt | grep -E " 64 +[0-9.]+ us" | head -1 | cut -c15-45)" >> $OUT/summary.txt
}
for mode in "" "--cold --serial"; do
  for c in 64x64/3 64x64/4 64x64/5 64x64/6 64x64/7 64x128/5 64x128/6 64x128/7; do run "fused qkv_a" $c $mode; done
  for c in 64x64/2 64x64/3 64x128/3 64x128/5 64x128/6; do run "o_proj" $c $mode; done
  for c in 64x64/3 64x64/4 64x64/5 64x128/5 64x128/6 64x128/7; do run "shared gate+up" $c $mode; done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $OUT/summary.txt
