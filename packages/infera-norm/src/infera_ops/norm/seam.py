"""Installs infera-norm: the ``infera`` provider of vLLM's IR ``rms_norm`` / ``fused_add_rms_norm``.

Registered whenever the checks pass, so ``--ir-op-priority '{"rms_norm": ["infera"], ...}'`` can pick it.
It goes first in vLLM's default priority only when the user names the op in ``INFERA_VLLM_OPS``: the
kernels beat vllm_c under CUDA graphs on the H200 (docs/operators/norm.md) but the end-to-end comparison
with Inductor's fused native code is still open (issue #3), and we do not ship an unmeasured default.
"""

import os

from infera_vllm.spec import Decline


def check(ctx) -> Decline | None:
    if ctx.env.gpu_family == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return Decline("triton-interpreter-off", "on the CPU the Triton kernels run only under TRITON_INTERPRET=1 "
                                                 "(validation); vLLM's CPU kernels serve")
    return None


def activate(ctx) -> Decline | None:
    decline = check(ctx)
    if decline is not None:
        return decline
    from infera_ops.norm import provider

    provider.install(ctx.spec.name, allow_cpu=ctx.env.gpu_family == "cpu")
    first = ctx.switches.requested_explicitly(ctx.spec.name)
    if first:
        provider.put_first_in_default_priority()
    ctx.state["note"] = "first in the default IR priority" if first else "registered, default priority unchanged"
    return None
