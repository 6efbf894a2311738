#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-moe-decode. TUNE=1 runs the tuning sweep
# (benchmarks/tune_moe_decode.py, with TUNE_ARGS; the file goes to $OUT/sm90.json and to /tmp/sm90.json, which later calls on
# the same machine pick up); TESTS=1 the kernel tests at GPU sizes (TESTS_K: a pytest -k selection); BENCH=1 (default) the kernels vs vLLM's
# fused_experts (benchmarks/bench_moe_decode.py) with that tuning. Each fits one 10-minute call.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
if [[ "${TUNE:-0}" == 1 ]]; then
  timeout "${TUNE_TIMEOUT:-540}" python3 benchmarks/tune_moe_decode.py --out "$OUT" ${TUNE_ARGS:-} 2>&1 | tee "$OUT/tune_moe_decode.log" \
    | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
  cp "$OUT/sm90.json" /tmp/sm90.json || INFERA_FAILED=1
fi
[[ -f /tmp/sm90.json ]] && export INFERA_MOE_DECODE_TUNING=/tmp/sm90.json
if [[ "${TESTS:-0}" == 1 ]]; then
  timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider packages/infera-moe-decode/tests \
    -k "${TESTS_K:-not vllm}" 2>&1 | tail -25 > "$OUT/pytest_moe_decode_sm90.txt" || INFERA_FAILED=1
  tail -3 "$OUT/pytest_moe_decode_sm90.txt"
fi
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_moe_decode.py --out "$OUT" 2>&1 | tee "$OUT/bench_moe_decode.log" \
    | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
fi
exit $INFERA_FAILED
