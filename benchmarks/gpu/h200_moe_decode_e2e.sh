#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: Qwen3-30B-A3B-shaped model (dummy weights), infera-moe-decode
# on vs off in alternating rounds (benchmarks/e2e_moe_decode.py; ROUNDS, default 2). Tuning: $TUNING, default
# /tmp/sm90.json from h200_moe_decode.sh TUNE=1 on the same machine, else the package's tuning/sm90.json.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
TUNING=${TUNING:-/tmp/sm90.json}
[[ -f "$TUNING" ]] && export INFERA_MOE_DECODE_TUNING="$TUNING"
timeout ${E2E_TIMEOUT:-560} python3 benchmarks/e2e_moe_decode.py --preset h200 --rounds ${ROUNDS:-2} --out "$OUT" 2>&1 \
  | tee "$OUT/e2e_moe_decode.log" | quiet "^(\(.*\) )?(INFO|WARNING|DEBUG)" | tail -40 || INFERA_FAILED=1
exit $INFERA_FAILED
