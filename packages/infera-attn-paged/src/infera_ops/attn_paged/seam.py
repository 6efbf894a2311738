"""Installs infera-attn-paged: ``InferaAttentionBackend`` (backend.py) in vLLM's ``CUSTOM`` attention slot.

Nothing changes until the user selects it (``--attention-backend CUSTOM``): vLLM's automatic choice on CUDA
(FLASH_ATTN first on sm90) is left alone. Not registered under a name of its own on 0.32, although
``register_backend("NAME", ...)`` exists there: such a member pickles by value and fails to unpickle in
spawned workers before they load plugins (docs/vllm-seams.md, Attention); ``CUSTOM`` does not.

``INFERA_ATTN_PAGED_DEFAULT=1`` makes it the platform's automatic choice (backend.make_platform_default):
where no backend was selected and it validates for the layer. No GPU family is validated for that by
measurement yet, so nowhere is it on unless the user sets it.

Declines on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``); with it the backend is
registered for validation. The CPU platform ignores ``--attention-backend``, so there the default switch is
the way in (validation only: the interpreter is orders of magnitude slower), and vLLM's CPU engine then
runs every attention call on the kernels.
"""

from infera_vllm import seams
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline

BACKEND = "infera_ops.attn_paged.backend.InferaAttentionBackend"


def check(ctx) -> Decline | None:
    """The platform and the tuning file: one that cannot be used raises, which the plugin turns into an
    ``activate-error`` decline with the message, in serving and in ``doctor`` alike. The switches (spec.py)
    were parsed by the plugin before this; a refused value declined the op ``bad-switch``."""
    off = interpreter_off(ctx.env.gpu_family, "vLLM's CPU attention")
    if off is not None:
        return off
    from infera_ops.attn_paged import tuning

    tuning.load(ctx.env.gpu_family or "unknown")
    return None


def activate(ctx) -> Decline | None:
    """Installs the backend; the plugin calls it only once ``check(ctx)`` passed."""
    from vllm.v1.attention.backends import registry

    default = ctx.switch("INFERA_ATTN_PAGED_DEFAULT")

    custom = registry.AttentionBackendEnum.CUSTOM
    seams.register(ctx.spec.name, registry, "_ATTN_OVERRIDES", custom,
                   lambda: registry.register_backend(custom, BACKEND))
    ctx.note = "registered as attention backend CUSTOM (select with --attention-backend CUSTOM)"
    if default:
        from infera_ops.attn_paged import backend

        backend.make_platform_default(ctx.spec.name)
        ctx.note = "vLLM's automatic attention choice where it validates (INFERA_ATTN_PAGED_DEFAULT=1), and CUSTOM"
    return None


def plan(site) -> Decline | None:
    """Would the backend's kernels take this attention layer (``doctor --model``)? Only with
    ``--attention-backend CUSTOM``; per batch, fp32 queries and the other per-call reasons still apply."""
    from infera_ops.attn_paged import guard, tuning
    from infera_vllm.platform import detect_gpu_family

    if site.attrs.get("head_size") not in guard.HEAD_SIZES:
        return Decline("head-size", f"head size {site.attrs.get('head_size')} not in {guard.HEAD_SIZES}")
    family = detect_gpu_family()[0]
    why = tuning.declined_head_size(site.attrs["head_size"], family)
    if why is not None:
        return Decline("head-size-on-family", f"head size {site.attrs['head_size']} on {family}: {why}")
    if str(site.attrs.get("dtype", "bfloat16")).replace("torch.", "") not in ("bfloat16", "float16"):
        return Decline("dtype", f"{site.attrs.get('dtype')}: the kernels take bf16/fp16")
    return None
