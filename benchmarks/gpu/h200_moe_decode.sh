#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-moe-decode's kernel tests at GPU sizes; TUNE=1 runs
# the tuning sweep first (writes $OUT/sm90.json, copied to /tmp/sm90.json for a later e2e call on the same
# machine); then the kernels vs vLLM's fused_experts (benchmarks/bench_moe_decode.py) with that tuning.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
python3 -m pytest -q -p no:cacheprovider packages/infera-moe-decode/tests -k "not vllm" 2>&1 | tail -25 > "$OUT/pytest_moe_decode_sm90.txt" || INFERA_FAILED=1
tail -3 "$OUT/pytest_moe_decode_sm90.txt"
if [[ "${TUNE:-0}" == 1 ]]; then
  BENCH_OUT="$OUT" timeout 420 python3 benchmarks/tune_moe_decode.py 2>&1 | tee "$OUT/tune_moe_decode.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
  cp "$OUT/sm90.json" /tmp/sm90.json && export INFERA_MOE_DECODE_TUNING=/tmp/sm90.json
fi
BENCH_OUT="$OUT" timeout 240 python3 benchmarks/bench_moe_decode.py 2>&1 | tee "$OUT/bench_moe_decode.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
exit $INFERA_FAILED
