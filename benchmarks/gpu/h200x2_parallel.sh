#!/usr/bin/env bash
# On the two-GPU machine (nvidia-h200-x2) after the vLLM 0.26.0 staging: issue #7's runs (benchmarks/e2e_parallel.py):
# dummy-weight models at TP=1/TP=2, plugin off/on, MoE with expert parallel. MODELS picks a subset.
set -uo pipefail
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERA_COMMIT=${INFERA_COMMIT:-$(cat dist/COMMIT 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site dist/*.whl 2>&1 | grep -v WARNING
nvidia-smi --query-gpu=index,name,memory.used --format=csv
timeout ${PAR_TIMEOUT:-570} python3 benchmarks/e2e_parallel.py --preset h200x2 ${MODELS:+--models $MODELS} --out "$OUT" 2>&1 \
  | tee "$OUT/e2e_parallel.log" | grep -v -E "^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing|socket.cpp" | tail -60
true
