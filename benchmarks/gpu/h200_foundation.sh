#!/usr/bin/env bash
# On the GPU machine, after ../shared/gpu/README.md's staging (vLLM 0.26.0 + SmolLM2 in /tmp/site, /tmp/models):
# install this checkout's wheels (built here by `nox -s wheels`, carried as dist/), then
#   infera-vllm doctor (text, JSON, and --model SmolLM2),
#   benchmarks/e2e_smollm2.py --preset h200 (FLASH_ATTN twice, TRITON_ATTN, plugin on),
#   infera-vllm report over the plugin-on run's processes.
# Everything lands flat in $OUT (the device tool brings back at most 8 files).
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
OUT=${OUT:?set OUT}
MODEL=${MODEL:-/tmp/models/smollm2-135m}
PRESET=${PRESET:-h200}
{
  python3 -m infera_vllm doctor > "$OUT/doctor.txt" 2>&1; echo "doctor exit $?" >> "$OUT/doctor.txt"
  python3 -m infera_vllm doctor --json > "$OUT/doctor.json" 2>/dev/null
  python3 -m infera_vllm doctor --model "$MODEL" > "$OUT/doctor-model.txt" 2>&1
  cat "$OUT/doctor.txt"
  python3 benchmarks/e2e_smollm2.py --preset "$PRESET" --model "$MODEL" --out "$OUT" --work /tmp/e2e-work || exit 1  # fails the group, so the pipeline
  python3 -m infera_vllm report /tmp/e2e-work/report-on > "$OUT/report-on.txt"
  python3 -m infera_vllm report /tmp/e2e-work/report-on --json > "$OUT/report-on.json"
  cat "$OUT/report-on.txt"
} 2>&1 | tee "$OUT/run.log" | quiet "^\((EngineCore|APIServer|Worker)|it/s\]|s/it\]" || INFERA_FAILED=1
exit $INFERA_FAILED
