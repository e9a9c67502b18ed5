#!/usr/bin/env bash
# Twenty-third session, on the final code (one H100): the twenty-second session's staged run118.sh,
# unchanged — every GPU suite, then `bench mla` token-major against head-major beside the layer.
exec bash "$(dirname "$0")/run118.sh" "$@"
