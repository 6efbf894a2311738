"""Installs infera-attn-paged: ``InferaAttentionBackend`` (backend.py) in vLLM's ``CUSTOM`` attention slot.

Nothing changes until the user selects it (``--attention-backend CUSTOM``): vLLM's automatic choice on CUDA
(FLASH_ATTN first on sm90) is left alone. Not registered under a name of its own on 0.32, although
``register_backend("NAME", ...)`` exists there: such a member pickles by value and fails to unpickle in
spawned workers before they load plugins (../shared/notes/vllm-seams.md §2.2); ``CUSTOM`` does not.

Declines on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``); with it the backend is
registered for validation (the CPU platform ignores ``--attention-backend`` and always serves CPU_ATTN).
"""

import os

from infera_vllm.spec import Decline

BACKEND = "infera_ops.attn_paged.backend.InferaAttentionBackend"


def check(ctx) -> Decline | None:
    if ctx.env.gpu_family == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return Decline("triton-interpreter-off", "on the CPU the Triton kernels run only under TRITON_INTERPRET=1 "
                                                 "(validation); vLLM's CPU attention serves")
    return None


def activate(ctx) -> Decline | None:
    decline = check(ctx)
    if decline is not None:
        return decline
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CUSTOM, BACKEND)  # idempotent: an override keyed by the slot
    ctx.state["note"] = "registered as attention backend CUSTOM (select with --attention-backend CUSTOM)"
    return None
