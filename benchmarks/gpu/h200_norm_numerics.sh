#!/usr/bin/env bash
# On the GPU machine after the vLLM 0.26.0 staging: bit-level agreement of the norm providers
# (benchmarks/norm_numerics.py), then SmolLM2 end to end with compiled native (vLLM's default), vllm_c
# and infera first, each against the first: how far vLLM's own providers disagree, beside infera.
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
MODEL=${MODEL:-/tmp/models/smollm2-135m}
python3 -m pytest -q -p no:cacheprovider packages/infera-norm/tests/test_norm_seam.py -k symbolic 2>&1 | tail -3 | tee "$OUT/pytest_norm_symbolic_sm90.txt"
BENCH_OUT="$OUT" python3 benchmarks/norm_numerics.py 2>&1 | quiet "^(INFO|WARNING)" | tee "$OUT/norm_numerics.log"
python3 benchmarks/e2e_smollm2.py --preset h200-norm-numerics --model "$MODEL" --out "$OUT" --work /tmp/e2e-num 2>&1 \
  | tee "$OUT/e2e_numerics.log" | quiet "^\((EngineCore|APIServer|Worker)|it/s\]|s/it\]|^(INFO|WARNING)" || INFERA_FAILED=1
exit $INFERA_FAILED
