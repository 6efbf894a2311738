#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-norm's tests on the GPU (kernels at real
# sizes, the provider through vLLM 0.26's IR), then its kernels vs vllm_c vs compiled native.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
python3 -m pytest -q -p no:cacheprovider packages/infera-norm/tests 2>&1 | tail -25 > "$OUT/pytest_norm_sm90.txt"; tail -3 "$OUT/pytest_norm_sm90.txt"
BENCH_OUT="$OUT" python3 benchmarks/bench_norm.py 2>&1 | tee "$OUT/bench_norm.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
exit $INFERA_FAILED
