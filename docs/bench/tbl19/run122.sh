#!/usr/bin/env bash
# Twenty-fourth session, the final commit's binaries: what run121.sh ran (run121 itself ran on one
# H100 with 0abeac6's), then the grouped points twice more (`bench kernels --no-dense`: the table's
# masked tile against every variant on the DeepGEMM anchors' rows, to see which variants win in
# every run).
set -u
bash "$(dirname "$0")/run121.sh" > /dev/null 2>&1
source scripts/device_env.sh
[[ -f $OUT/logs.tgz ]] && tar xzf $OUT/logs.tgz -C $OUT && rm $OUT/logs.tgz
for i in 1 2; do
  run_line "grouped $i" grouped.$i $B/apps/fanout bench kernels --no-dense --json $L/grouped.$i.json
done
cd $OUT && tar czf logs.tgz logs && rm -rf logs
cat $S
