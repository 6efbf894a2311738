#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-linear-hipblaslt's kernel tests at GPU sizes, then
# (BENCH=1, default) the skinny-M kernel, cuBLASLt and TunableOp vs F.linear on the issue's shapes
# (benchmarks/bench_linear.py); TUNE=1: `infera-vllm tune linear` on the Llama-3-8B-shaped config, the table to
# $OUT/sm90.json and /tmp/sm90_linear.json; E2E=1: that model (dummy weights) served plugin off vs the linear op
# alone with that table (benchmarks/e2e_parallel.py --preset h200-linear).
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
if [[ "${BENCH:-1}" == 1 ]]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider packages/infera-linear-hipblaslt/tests -k "kernels" 2>&1 | tail -5 > "$OUT/pytest_linear_sm90.txt" || INFERA_FAILED=1
  tail -2 "$OUT/pytest_linear_sm90.txt"
  BENCH_OUT="$OUT" timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bench_linear.py ${TOKENS:+--tokens $TOKENS} 2>&1 | tee "$OUT/bench_linear.log" | quiet "^(INFO|WARNING)" || INFERA_FAILED=1
fi
if [[ "${TUNE:-0}" == 1 ]]; then
  mkdir -p /tmp/llama-3-8b && python3 -c "
import json, sys; sys.path.insert(0, 'benchmarks'); from e2e_parallel import MODELS
json.dump(MODELS['llama-3-8b'], open('/tmp/llama-3-8b/config.json', 'w'))"
  timeout ${TUNE_TIMEOUT:-400} python3 -m infera_vllm tune linear --model /tmp/llama-3-8b --out /tmp/sm90_linear.json 2>&1 \
    | tee "$OUT/tune_linear.log" | quiet "^(INFO|WARNING)|skip" || INFERA_FAILED=1
  cp /tmp/sm90_linear.json "$OUT/sm90.json" 2>/dev/null
fi
if [[ "${E2E:-0}" == 1 ]]; then
  export INFERA_LINEAR_TUNING=${INFERA_LINEAR_TUNING:-/tmp/sm90_linear.json}
  timeout ${E2E_TIMEOUT:-560} python3 benchmarks/e2e_parallel.py --preset h200-linear --out "$OUT" 2>&1 \
    | tee "$OUT/e2e_linear.log" | quiet "^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing" | tail -40 || INFERA_FAILED=1
fi
exit $INFERA_FAILED
