#!/usr/bin/env bash
# Do the decode GEMMs scale with bytes in flight? Probe builds with the ring capped at 4, 3 and 2
# stages (fanout_sN: `constexpr int S = min(stages<BM, BN>(), N)` in launch_config; the 64 x 64
# tiles have 6) beside the final build, M = 64, alternating. Run from the repository root.
set -u
source scripts/device_env.sh
tar xJf .carry/stages.tar.xz -C .carry
ex='match($0, / 64 +[0-9.]+ us/) { n = substr($0, 1, RSTART - 1); sub(/ +$/, "", n); t = substr($0, RSTART + 3, RLENGTH - 3); gsub(/ /, "", t); printf "%s %s; ", n, t }'
for i in 1 2; do
  for v in final s4 s3 s2; do
    bin=$B/apps/fanout; [ $v != final ] && bin=.carry/stages/fanout_$v
    timeout 60 $bin bench kernels --no-grouped --m 64 --json $L/m64.$v.$i.json > $L/m64.$v.$i.txt 2>&1
    echo "m64 $v run $i: $(grep -A1 '^sum over' $L/m64.$v.$i.txt | tail -1) | $(awk "$ex" $L/m64.$v.$i.txt)" >> $S
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
