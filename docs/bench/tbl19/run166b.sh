#!/usr/bin/env bash
# Thirty-ninth session, run right after run166 on the same warm machine (H100; the command as it was
# passed to the device tool): two more samples of o_proj, the shared down projection and the dense
# MLP's down projection forced to 128 x 256 pairs with stream-K at M = 1,024, each followed by the
# table's six shapes. Same pack and carry as run166.
set -u; source scripts/device_env.sh; for i in 1 2; do for cfg in 128x256/skc2; do timeout 40 $B/apps/fanout bench kernels --no-grouped --m 1024 --config $cfg --json $L/sk2.$i.json > $L/sk2.$i.txt 2>&1; grep -E "^o_proj|^dense down|^shared down" $L/sk2.$i.txt; done; kernels_line "r$i table" m1024.t.$i $B/apps/fanout 1024; done; cat $S
