#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: infera-attn-paged end to end, dummy-weight models served
# with FLASH_ATTN and with CUSTOM side by side, alternating rounds (benchmarks/e2e_attn_paged.py; MODELS picks
# them, default Llama-3-8B-shaped; ROUNDS, default 2), with the tuning of an earlier h200_attn_paged.sh call on
# this machine where there is one. SMOLLM2=1 adds SmolLM2's real-weight agreement and throughput
# (e2e_smollm2.py --preset h200-attn: FLASH_ATTN vs CUSTOM vs TRITON_ATTN).
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
[[ -f /tmp/attn_paged_tuning.json ]] && export INFERA_ATTN_PAGED_TUNING=/tmp/attn_paged_tuning.json
timeout "${E2E_TIMEOUT:-560}" python3 benchmarks/e2e_attn_paged.py --preset h200 --rounds "${ROUNDS:-2}" ${MODELS:+--models $MODELS} \
  --out "$OUT" 2>&1 | tee "$OUT/e2e_attn_paged.log" | quiet "^(\(.*\) )?(INFO|WARNING|DEBUG)|Capturing|it/s\]" || INFERA_FAILED=1
if [[ "${SMOLLM2:-0}" == 1 ]]; then
  python3 benchmarks/e2e_smollm2.py --preset h200-attn --rounds 1 --model /tmp/models/smollm2-135m --out "$OUT" \
    --work /tmp/e2e-work 2>&1 | tee "$OUT/e2e_smollm2.log" | quiet "^\((EngineCore|APIServer|Worker)|it/s\]|s/it\]" \
    || INFERA_FAILED=1
fi
exit $INFERA_FAILED
