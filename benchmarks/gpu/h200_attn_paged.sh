#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-attn-paged's decode and prefill launches tuned for
# this GPU (benchmarks/tune_attn_paged.py, with TUNE_ARGS, e.g. --no-decode: the tuning file to $OUT/attn_paged_sm90.json and to
# /tmp/attn_paged_tuning.json, which later calls on the same machine pick up; TUNE=0 skips it), then its kernels
# vs vLLM 0.26's FA3 and Triton (benchmarks/bench_attn_paged.py: decode and prefill tables, JSON, PNGs) with
# that tuning. BENCH_SWEEP=1 adds the benchmark's own per-row sweep, BENCH_PREFILL=0 skips prefill; BENCH=0 skips
# the benchmark. TESTS=1 then runs the package's GPU tests with that tuning (benchmarks/gpu/h200_tests.sh,
# PACKAGES=infera-attn-paged). End to end: h200_attn_e2e.sh.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
if [[ "${TUNE:-1}" == 1 ]]; then
  # budgets within the timeout (the tuner writes its file at the end; setup and FA3's baseline take ~40 s)
  BENCH_OUT="$OUT" timeout "${TUNE_TIMEOUT:-330}" python3 benchmarks/tune_attn_paged.py --budget-s "${TUNE_BUDGET_S:-180}" \
    --prefill-budget-s "${TUNE_PREFILL_BUDGET_S:-100}" ${TUNE_ARGS:-} 2>&1 \
    | tee "$OUT/tune_attn_paged.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
  cp "$OUT/attn_paged_sm90.json" /tmp/attn_paged_tuning.json || INFERA_FAILED=1
fi
[[ -f /tmp/attn_paged_tuning.json ]] && export INFERA_ATTN_PAGED_TUNING=/tmp/attn_paged_tuning.json
if [[ "${BENCH:-1}" == 1 ]]; then
  BENCH_OUT="$OUT" timeout "${BENCH_TIMEOUT:-120}" python3 benchmarks/bench_attn_paged.py 2>&1 | tee "$OUT/bench_attn_paged.log" \
    | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
fi
if [[ "${TESTS:-0}" == 1 ]]; then
  PACKAGES=infera-attn-paged TESTS_BUDGET_S="${TESTS_BUDGET_S:-170}" bash "$(dirname "$0")/h200_tests.sh" || INFERA_FAILED=1
fi
exit $INFERA_FAILED
