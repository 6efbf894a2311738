#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-attn-paged's tests on the GPU (all but e2e), then
# its paged decode kernel vs vLLM 0.26's FA3 and Triton unified_attention (benchmarks/bench_attn_paged.py:
# table + JSON + PNG into $OUT). BENCH_SWEEP=1 adds the launch-config x splits sweep (bounded by
# BENCH_SWEEP_BUDGET_S, default 180 s; raise BENCH_TIMEOUT with it); BENCH_L2=warm times on one KV copy.
set -uo pipefail
source "$(dirname "$0")/_env.sh"
python3 -m pytest -q -p no:cacheprovider packages/infera-attn-paged/tests -m "not e2e" 2>&1 | tail -25 > "$OUT/pytest_attn_paged_sm90.txt"
tail -3 "$OUT/pytest_attn_paged_sm90.txt"
BENCH_OUT="$OUT" timeout "${BENCH_TIMEOUT:-400}" python3 benchmarks/bench_attn_paged.py 2>&1 | tee "$OUT/bench_attn_paged.log" | grep -v -E "^(INFO|WARNING)"
true
