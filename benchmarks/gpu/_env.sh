# Sourced by every benchmarks/gpu/*.sh on the GPU machine (after ../shared/gpu/README.md's staging): the staged
# vLLM 0.26.0 on the path, FlashInfer's sampler off (not staged), this checkout's wheels (built here by
# `nox -s wheels`, carried as dist/ with dist/COMMIT) installed over it, and the commit results record.
# Its status is 0 exactly when that setup succeeded, so `source _env.sh && cmd` and `source _env.sh || exit`
# both mean what they say. Also defines:
#   quiet PATTERN   grep -v -E PATTERN that succeeds when every line was filtered away (grep exits 1 then)
#   INFERA_FAILED   0; a script ends each step with `|| INFERA_FAILED=1` and exits with it, so a failed step
#                   is never hidden behind a later success (and, under pipefail, neither by tee nor by quiet)
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERA_COMMIT=${INFERA_COMMIT:-$(cat dist/COMMIT 2>/dev/null || echo unknown)}
INFERA_FAILED=0

quiet() { grep -v -E "$1"; local rc=$?; [[ $rc -le 1 ]]; }


_infera_setup() {
  if [[ ! -d /tmp/site/vllm ]]; then
    echo "_env.sh: no staged vLLM in /tmp/site (run ../shared/gpu/README.md's staging on this machine first)" >&2
    return 1
  fi
  if ! ls dist/*.whl >/dev/null 2>&1; then
    echo "_env.sh: no wheels in dist/ (build them with 'nox -s wheels' and carry dist)" >&2
    return 1
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site dist/*.whl 2>&1 \
    | quiet "WARNING|already exists|--upgrade"
  local st=("${PIPESTATUS[@]}")  # pip's status, whatever the caller's pipefail
  [[ ${st[0]} -eq 0 && ${st[1]} -eq 0 ]] || { echo "_env.sh: installing dist/*.whl failed" >&2; return 1; }
}
_infera_setup
