"""Installs infera-norm: the ``infera`` provider of vLLM's IR ``rms_norm`` / ``fused_add_rms_norm``.

Registered whenever the checks pass, so ``--ir-op-priority '{"rms_norm": ["infera"], ...}'`` can pick it.
It goes first in vLLM's default priority on the GPU families where that was measured not to lose end to
end (``FIRST_BY_DEFAULT``, empty today: docs/operators/norm.md), or anywhere the user names the op in
``INFERA_VLLM_OPS``; a user's own ``--ir-op-priority`` still wins (vLLM puts it before the defaults).
"""

from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline

# Families where infera goes first without being named. Not sm90: the kernels beat vllm_c under CUDA graphs
# and SmolLM2 end to end was 1.000x, but a Qwen3-8B-shaped model lost 3-8% end to end (H200, vLLM 0.26,
# benchmarks/results/h200/norm-qwen3/), so on sm90 the op must be named to go first.
FIRST_BY_DEFAULT: tuple[str, ...] = ()


def check(ctx) -> Decline | None:
    return interpreter_off(ctx.env.gpu_family, "vLLM's CPU kernels")


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    from infera_ops.norm import provider

    provider.install(ctx.spec.name, allow_cpu=ctx.env.gpu_family == "cpu")
    # what the provider bakes into compiled graphs beyond its version: vLLM's compile cache keys on it
    ctx.compile_key = "per-head:" + ("kernel" if ctx.switch("INFERA_NORM_PER_HEAD_KERNEL") else "vllm")
    named = ctx.switches.requested_explicitly(ctx.spec.name)
    validated = ctx.env.gpu_family in FIRST_BY_DEFAULT
    if named or validated:
        provider.put_first_in_default_priority(ctx.spec.name)
        why = "named in INFERA_VLLM_OPS" if named else f"measured on {ctx.env.gpu_family}"
        ctx.note = f"first in the default IR priority ({why})"
    else:
        ctx.note = "registered, default priority unchanged"
    return None
