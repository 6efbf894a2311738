#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging (with SmolLM2): SmolLM2 end to end, compiled with CUDA
# graphs: FLASH_ATTN (plugin off) vs infera-attn-paged (--attention-backend CUSTOM, INFERA_VLLM_OPS=attn-paged)
# vs TRITON_ATTN, alternated ROUNDS times; then the coverage report of the first plugin-on run.
set -uo pipefail
source "$(dirname "$0")/_env.sh"
MODEL=${MODEL:-/tmp/models/smollm2-135m}
{
  python3 benchmarks/e2e_smollm2.py --preset h200-attn --rounds "${ROUNDS:-1}" --model "$MODEL" --out "$OUT" --work /tmp/e2e-work
  first_on=$(ls -d /tmp/e2e-work/report-on-attn* | head -1)
  python3 -m infera_vllm report "$first_on" | tee "$OUT/report-on-attn.txt"
  python3 -m infera_vllm report "$first_on" --json > "$OUT/report-on-attn.json"
} 2>&1 | tee "$OUT/e2e.log" | grep -v -E "^\((EngineCore|APIServer|Worker)|it/s\]|s/it\]"
