#!/usr/bin/env bash
# On the GPU machine after ../shared/gpu/README.md's staging (with SmolLM2 for the meta package's end-to-end
# test): every package's tests that can run on a GPU, i.e. all but those marked `cpu_build` (they need vLLM's
# CPU build and Triton's interpreter). One pytest per package, its whole output in $OUT/pytest_<package>.txt
# with the commit on its first line; the meta package runs beside the op packages (it mostly starts CPU-side
# processes), the op packages one after another. Exits non-zero when any package fails or times out.
#   bash benchmarks/gpu/h200_tests.sh            (carry dist/, built by `nox -s wheels`)
#   PACKAGES="infera-attn-paged" bash benchmarks/gpu/h200_tests.sh   only these (space-separated; infera-vllm is
#                                                the meta package), e.g. after a benchmark in the same call
set -uo pipefail
source "$(dirname "$0")/_env.sh" || exit 1
export INFERA_GPU_FAMILY=sm90 INFERA_AOT_FAMILY=sm90  # the compile tests: this GPU's family, with its Triton
# the decode tuning an earlier h200_attn_paged.sh call on this machine wrote, if any: the tests run what serves
[[ -f /tmp/attn_paged_tuning.json ]] && export INFERA_ATTN_PAGED_TUNING=/tmp/attn_paged_tuning.json

run_package() {  # run_package DIR TIMEOUT_S
  local name; name=$(basename "$1")
  ( echo "commit $INFERA_COMMIT  package $name  $(date -u +%FT%TZ)"
    timeout "$2" python3 -m pytest -p no:cacheprovider -q -rfEs -m "not cpu_build" "$1/tests" 2>&1
    rc=$?; echo "exit $rc"; exit $rc
  ) > "$OUT/pytest_$name.txt"  # a subshell: its exit ends only this package
  local rc=$?
  echo "$name: $(grep -E '(passed|failed|error|no tests ran)' "$OUT/pytest_$name.txt" | tail -1) (exit $rc)"
  return $rc
}

wanted() { [[ -z "${PACKAGES:-}" || " $PACKAGES " == *" $(basename "$1") "* ]]; }

deadline=$((SECONDS + ${TESTS_BUDGET_S:-560}))  # inside one 600 s device call
meta_job=
if wanted meta/infera-vllm; then run_package meta/infera-vllm "${TESTS_BUDGET_S:-560}" & meta_job=$!; fi
for dir in packages/infera-*; do
  [[ -f "$dir/pyproject.toml" ]] && wanted "$dir" || continue
  run_package "$dir" $((deadline - SECONDS)) || INFERA_FAILED=1
done
[[ -z "$meta_job" ]] || wait "$meta_job" || INFERA_FAILED=1
exit $INFERA_FAILED
