# Sourced by every benchmarks/gpu/*.sh on the GPU machine (after ../shared/gpu/README.md's staging): the staged
# vLLM 0.26.0 on the path, FlashInfer's sampler off (not staged), this checkout's wheels (built here by
# `nox -s wheels`, carried as dist/ with dist/COMMIT) installed over it, and the commit results record.
export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export INFERA_COMMIT=${INFERA_COMMIT:-$(cat dist/COMMIT 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site dist/*.whl 2>&1 | grep -v WARNING
