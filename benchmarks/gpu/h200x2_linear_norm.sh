#!/usr/bin/env bash
# On the two-GPU machine after the vLLM 0.26.0 staging, two independent single-GPU jobs side by side:
# GPU 0: `infera-vllm tune linear` on the Llama-3-8B-shaped config (h200_linear.sh TUNE=1);
# GPU 1: Qwen3-8B-shaped random checkpoint, plugin off vs infera-norm
# (e2e_parallel.py --preset h200-norm-qwen3). The e2e ratios compare runs made under the same neighbour.
set -uo pipefail
INFERA_FAILED=0
mkdir -p "$OUT/norm-qwen3"
( export CUDA_VISIBLE_DEVICES=1 PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
  export INFERA_COMMIT=$(cat dist/COMMIT)
  sleep 20  # the other job installs the wheels first
  timeout 540 python3 benchmarks/e2e_parallel.py --preset h200-norm-qwen3 --out "$OUT/norm-qwen3" > "$OUT/norm-qwen3/e2e.log" 2>&1 ) &
norm_job=$!
CUDA_VISIBLE_DEVICES=0 BENCH=0 TUNE=1 TUNE_TIMEOUT=500 bash benchmarks/gpu/h200_linear.sh || INFERA_FAILED=1
wait $norm_job || INFERA_FAILED=1
grep -v -E "^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing|socket.cpp" "$OUT/norm-qwen3/e2e.log" | tail -20
exit $INFERA_FAILED
