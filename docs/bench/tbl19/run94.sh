#!/usr/bin/env bash
# Do the decode GEMMs scale with bytes in flight? Probe builds with the ring capped at 4, 3 and 2
# stages (fanout_sN: `constexpr int S = min(stages<BM, BN>(), N)` in launch_config; the 64 x 64
# tiles have 6) beside the final build, M = 64, alternating. Run from the repository root.
# (The M = 64 line: m64_line of scripts/device_env.sh since the seventeenth session's review, the
# same commands this script ran inline.)
set -u
source scripts/device_env.sh
tar xJf .carry/stages.tar.xz -C .carry
for i in 1 2; do
  for v in final s4 s3 s2; do
    bin=$B/apps/fanout; [ $v != final ] && bin=.carry/stages/fanout_$v
    m64_line "$v run $i" m64.$v.$i $bin
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
