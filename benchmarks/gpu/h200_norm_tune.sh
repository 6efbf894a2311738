#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-norm's tests on the GPU, then the launch
# parameter sweep (benchmarks/tune_norm.py) whose figures choose kernels.py's heuristic.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
python3 -m pytest -q -p no:cacheprovider packages/infera-norm/tests 2>&1 | tail -25 > "$OUT/pytest_norm_sm90.txt" || INFERA_FAILED=1
tail -3 "$OUT/pytest_norm_sm90.txt"
BENCH_OUT="$OUT" python3 benchmarks/tune_norm.py 2>&1 | tee "$OUT/tune_norm.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
exit $INFERA_FAILED
