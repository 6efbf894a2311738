#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: SmolLM2 end to end, compiled with CUDA graphs,
# plugin off vs infera-norm first in the IR priority (INFERA_VLLM_OPS=norm), runs alternated ROUNDS times;
# then the coverage report of the first plugin-on run (which provider the compiled graph took, counted).
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
MODEL=${MODEL:-/tmp/models/smollm2-135m}
{
  python3 benchmarks/e2e_smollm2.py --preset h200-norm --rounds "${ROUNDS:-2}" --model "$MODEL" --out "$OUT" --work /tmp/e2e-work || exit 1  # fails the group, so the pipeline
  first_on=$(ls -d /tmp/e2e-work/report-on-norm* | head -1)
  python3 -m infera_vllm report "$first_on" | tee "$OUT/report-on-norm.txt"
  python3 -m infera_vllm report "$first_on" --json > "$OUT/report-on-norm.json"
} 2>&1 | tee "$OUT/e2e.log" | quiet "^\((EngineCore|APIServer|Worker)|it/s\]|s/it\]" || INFERA_FAILED=1
exit $INFERA_FAILED
