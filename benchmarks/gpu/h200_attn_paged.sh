#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-attn-paged's tests on the GPU (all but e2e; TESTS=0
# skips them), then its kernels vs vLLM 0.26's FA3 and Triton unified_attention (benchmarks/bench_attn_paged.py:
# decode and prefill tables + JSON + PNGs into $OUT). BENCH_SWEEP=1 adds the launch-config x splits sweep
# (bounded by BENCH_SWEEP_BUDGET_S, default 180 s; raise BENCH_TIMEOUT with it), BENCH_PREFILL=0 skips the
# prefill section, BENCH_L2=warm times decode on one KV copy. A call has 600 s: tests + decode + prefill fit
# one call, the sweep another (TESTS=0 BENCH_PREFILL=0 BENCH_SWEEP=1).
set -uo pipefail
source "$(dirname "$0")/_env.sh"
if [[ "${TESTS:-1}" == 1 ]]; then
  timeout 200 python3 -m pytest -q -p no:cacheprovider packages/infera-attn-paged/tests -m "not e2e" 2>&1 | tail -25 > "$OUT/pytest_attn_paged_sm90.txt"
  tail -3 "$OUT/pytest_attn_paged_sm90.txt"
fi
BENCH_OUT="$OUT" timeout "${BENCH_TIMEOUT:-360}" python3 benchmarks/bench_attn_paged.py 2>&1 | tee "$OUT/bench_attn_paged.log" | grep -v -E "^(INFO|WARNING)"
true
