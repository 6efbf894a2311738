"""Installs infera-moe-decode: vLLM's unquantized MoE method with the decode experts kernel (experts.py).

Declines at startup, with its reason: on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``)
or before vLLM 0.32 (``cpu-monolithic``: the CPU path has no experts class to extend); a GPU family
without a tuning file (``not-tuned``) unless ``INFERA_MOE_DECODE_MAX_TOKENS`` is set; an unreadable
tuning file or switch (``bad-tuning``). ``INFERA_MOE_DECODE_CHECK_REFERENCE`` picks the self-check's
reference (experts.py).
"""

from infera_vllm.compat import version_in
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline
from infera_vllm.switches import op_value


def _tuning(ctx):
    from infera_ops.moe_decode import tuning

    try:
        found = tuning.load(ctx.env.gpu_family or "unknown")
    except tuning.TuningError as exc:
        return None, Decline("bad-tuning", str(exc))
    if found is None:
        return None, Decline("not-tuned", f"no tuning file for {ctx.env.gpu_family}: run "
                                          "benchmarks/tune_moe_decode.py on that GPU, "
                                          "or set INFERA_MOE_DECODE_MAX_TOKENS")
    return found, None


def check(ctx) -> Decline | None:
    off = interpreter_off(ctx.env.gpu_family, "vLLM's CPU experts")
    if off is not None:
        return off
    if ctx.env.gpu_family == "cpu":
        if ctx.env.vllm and not version_in(ctx.env.vllm, ">=0.32"):
            return Decline("cpu-monolithic",
                           f"vLLM {ctx.env.vllm}'s CPU MoE is monolithic (no experts class to extend)")
    return _tuning(ctx)[1]


def activate(ctx) -> Decline | None:
    """Installs the seam; the plugin calls it only once ``check(ctx)`` passed."""
    found, _ = _tuning(ctx)
    from infera_ops.moe_decode import experts

    cpu = ctx.env.gpu_family == "cpu"
    reference = op_value(ctx.spec, "INFERA_MOE_DECODE_CHECK_REFERENCE")
    experts.install(ctx.spec.name, found, cpu=cpu, bound=ctx.spec.self_check_bound,
                    check_against_vllm=reference == "vllm" or (reference == "auto" and cpu))
    ctx.note = f"serves up to {found.largest_served} tokens ({found.source})"
    return None
