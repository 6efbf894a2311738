"""Installs infera-attn-paged: ``InferaAttentionBackend`` (backend.py) in vLLM's ``CUSTOM`` attention slot.

Nothing changes until the user selects it (``--attention-backend CUSTOM``): vLLM's automatic choice on CUDA
(FLASH_ATTN first on sm90) is left alone. Not registered under a name of its own on 0.32, although
``register_backend("NAME", ...)`` exists there: such a member pickles by value and fails to unpickle in
spawned workers before they load plugins (../shared/notes/vllm-seams.md §2.2); ``CUSTOM`` does not.

Declines on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``); with it the backend is
registered for validation. The CPU platform ignores ``--attention-backend`` and always serves its CPU_ATTN
slot, so the test switch ``INFERA_ATTN_PAGED_CPU_SLOT=1`` (CPU only, never for serving: the interpreter is
orders of magnitude slower) puts the backend in that slot, and vLLM's CPU engine runs the kernels end to end.
"""

import os

from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline

BACKEND = "infera_ops.attn_paged.backend.InferaAttentionBackend"


def check(ctx) -> Decline | None:
    return interpreter_off(ctx.env.gpu_family, "vLLM's CPU attention")


def activate(ctx) -> Decline | None:
    decline = check(ctx)
    if decline is not None:
        return decline
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from infera_ops.attn_paged import guard

    guard.prefill_on_kernel()  # a bad INFERA_ATTN_PAGED_PREFILL raises here: activate-error, vLLM unharmed

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)  # idempotent: an override keyed by the slot
    ctx.state["note"] = "registered as attention backend CUSTOM (select with --attention-backend CUSTOM)"
    if ctx.env.gpu_family == "cpu" and os.environ.get("INFERA_ATTN_PAGED_CPU_SLOT") == "1":
        register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND)
        ctx.state["note"] = "in vLLM's CPU_ATTN slot (INFERA_ATTN_PAGED_CPU_SLOT=1, validation under the interpreter)"
    return None


def plan(site) -> Decline | None:
    """Would the backend's kernels take this attention layer (``doctor --model``)? Only with
    ``--attention-backend CUSTOM``; per batch, fp32 queries and the other per-call reasons still apply."""
    from infera_ops.attn_paged import guard

    if site.attrs.get("head_size") not in guard.HEAD_SIZES:
        return Decline("head-size", f"head size {site.attrs.get('head_size')} not in {guard.HEAD_SIZES}")
    if str(site.attrs.get("dtype", "bfloat16")).replace("torch.", "") not in ("bfloat16", "float16"):
        return Decline("dtype", f"{site.attrs.get('dtype')}: the kernels take bf16/fp16")
    return None
