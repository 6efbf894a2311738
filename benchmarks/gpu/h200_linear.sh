#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-linear-hipblaslt's kernel tests at GPU sizes, then the
# skinny-M kernel vs F.linear on the shapes (benchmarks/bench_linear.py).
set -uo pipefail
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
export INFERA_COMMIT=${INFERA_COMMIT:-$(cat dist/COMMIT 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site dist/*.whl 2>&1 | grep -v WARNING
BENCH_OUT="$OUT" timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/bench_linear.py ${TOKENS:+--tokens $TOKENS} 2>&1 | tee "$OUT/bench_linear.log" | grep -v -E "^(INFO|WARNING)"
timeout 60 python3 -m pytest -q -p no:cacheprovider packages/infera-linear-hipblaslt/tests -k "kernels" 2>&1 | tail -5 > "$OUT/pytest_linear_sm90.txt"
tail -2 "$OUT/pytest_linear_sm90.txt"
true
