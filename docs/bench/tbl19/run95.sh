#!/usr/bin/env bash
# Is it x? run94: o_proj at M = 64 is the same with 4 ring stages as with 6, so bytes of W in flight
# do not hold it. Probe build fanout_nox (`no_x_probe.patch`): with FANOUT_PROBE_NO_X set the
# producer loads no x tile (each stage expects W's bytes only; results garbage), so the stage waits
# on W alone and no x crosses L2 or its partition fabric. M = 64, alternating with the final build
# and with the probe build unset. Run from the repository root.
# (The M = 64 line: m64_line of scripts/device_env.sh since the seventeenth session's review, the
# same commands this script ran inline.)
set -u
source scripts/device_env.sh
tar xJf .carry/stages.tar.xz -C .carry
for i in 1 2; do
  for v in final probe_unset no_x; do
    bin=$B/apps/fanout; [ $v != final ] && bin=.carry/stages/fanout_nox
    if [ $v = no_x ]; then export FANOUT_PROBE_NO_X=1; else unset FANOUT_PROBE_NO_X; fi
    m64_line "$v run $i" m64.$v.$i $bin
  done
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
