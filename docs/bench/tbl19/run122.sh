#!/usr/bin/env bash
# Twenty-fourth session, the final commit's binaries: run121.sh unchanged (run121 itself ran on one
# H100 with 0abeac6's; this adds the engine's per-request sampling failure and the capture test's
# illegal sync).
exec bash "$(dirname "$0")/run121.sh" "$@"
