#!/usr/bin/env bash
# On the GPU machine after the staging with SmolLM2: the self-check's cost and outcome at startup
# (docs/self-check.md) on SmolLM2-135M (real weights: norm and attn-paged) and on a Qwen3-30B-A3B-shaped
# dummy-weight model cut to MOE_LAYERS layers (norm, attn-paged and moe-decode: the expert dims are the
# full model's, so moe-decode serves its tuned shape). `infera-vllm validate --self-check-cost` runs
# off, every-op (check on), every-op-nocheck (check off), then the rest as the budget allows; its table shows
# each op's checked buckets, passes and largest error, the seconds vLLM's reference runs took, and their
# share of startup. Results: $OUT/validate_<model>.{json,png,txt}.
#   SMOLLM2_BUDGET_S=260 MOE_BUDGET_S=260 bash benchmarks/gpu/h200_self_check.sh
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
# the decode tuning an earlier h200_attn_paged.sh call on this machine wrote, if any
[[ -f /tmp/attn_paged_tuning.json ]] && export INFERA_ATTN_PAGED_TUNING=/tmp/attn_paged_tuning.json
common=(--self-check-cost --rounds 1 --batches 1,16 --work /tmp/self_check_work)
if [[ -d /tmp/models/smollm2-135m && "${SMOLLM2_BUDGET_S:-260}" != 0 ]]; then
  python3 -m infera_vllm validate /tmp/models/smollm2-135m "${common[@]}" --ops norm,attn-paged \
    --budget-s "${SMOLLM2_BUDGET_S:-260}" --out "$OUT/validate_smollm2.json" 2>&1 | grep -v -E "^(INFO|WARNING)" \
    | tail -60 > "$OUT/validate_smollm2.txt" || INFERA_FAILED=1
  cat "$OUT/validate_smollm2.txt"
fi
if [[ "${MOE_BUDGET_S:-260}" != 0 ]]; then
  mkdir -p /tmp/qwen3-moe-cut
  python3 - "${MOE_LAYERS:-4}" <<'PY' || INFERA_FAILED=1
import json, sys
matrix = json.load(open("benchmarks/validation/matrix.json"))
config = next(m["config"] for m in matrix["models"] if m["name"] == "qwen3-30b-a3b")
json.dump({**config, "num_hidden_layers": int(sys.argv[1])}, open("/tmp/qwen3-moe-cut/config.json", "w"))
PY
  python3 -m infera_vllm validate --dummy /tmp/qwen3-moe-cut "${common[@]}" --ops norm,attn-paged,moe-decode \
    --budget-s "${MOE_BUDGET_S:-260}" --out "$OUT/validate_qwen3_moe_cut.json" 2>&1 \
    | grep -v -E "^(INFO|WARNING)" | tail -60 > "$OUT/validate_qwen3_moe_cut.txt" || INFERA_FAILED=1
  cat "$OUT/validate_qwen3_moe_cut.txt"
fi
exit $INFERA_FAILED
