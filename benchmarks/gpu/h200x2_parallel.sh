#!/usr/bin/env bash
# On the two-GPU machine (nvidia-h200-x2) after the vLLM 0.26.0 staging: every op under tensor and
# expert parallelism (benchmarks/e2e_parallel.py).
# PRESET=h200x2 (default): dummy-weight models at TP=2, plugin off/on, MoE with expert parallel; MODELS picks a subset.
# PRESET=h200x2-random: a Qwen3-8B-shaped random checkpoint at TP=1 and TP=2 (same model at both sizes).
# Then `infera-vllm doctor` once per GPU (CUDA_VISIBLE_DEVICES=0 and 1): the verdicts each rank's process would see.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
PRESET=${PRESET:-h200x2}
nvidia-smi --query-gpu=index,name,memory.used --format=csv
mkdir -p /tmp/doctor-model && python3 -c "
import json, sys; sys.path.insert(0, 'benchmarks'); from e2e_parallel import MODELS
json.dump(MODELS['qwen3-30b-a3b'], open('/tmp/doctor-model/config.json', 'w'))"
for gpu in 0 1; do
  CUDA_VISIBLE_DEVICES=$gpu timeout 120 python3 -m infera_vllm doctor --model /tmp/doctor-model > "$OUT/doctor_gpu$gpu.txt" 2>&1
  echo "doctor on GPU $gpu: exit $?"
done
diff <(grep -v -i -E "pid|uuid|bus" "$OUT/doctor_gpu0.txt") <(grep -v -i -E "pid|uuid|bus" "$OUT/doctor_gpu1.txt") \
  && echo "doctor: same output on both GPUs" | tee "$OUT/doctor_same.txt"
timeout ${PAR_TIMEOUT:-540} python3 benchmarks/e2e_parallel.py --preset "$PRESET" ${MODELS:+--models $MODELS} --out "$OUT" 2>&1 \
  | tee "$OUT/e2e_parallel.log" | quiet "^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing|socket.cpp" | tail -60 || INFERA_FAILED=1
exit $INFERA_FAILED
