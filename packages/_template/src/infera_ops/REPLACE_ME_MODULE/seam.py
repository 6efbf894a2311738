"""Installs the operator into vLLM. Imported only after the plugin's checks passed, so heavy imports are fine.

``check(ctx)``: the verdict without side effects (used by ``infera-vllm doctor``).
``activate(ctx)``: install the seam and return ``None``, or return a ``Decline``. Per call, route through
counters made once here: ``kernel = ctx.counter("kernel", bucket=...)``, ``fallback = ctx.counter("fallback", "dtype")``.
"""

from infera_vllm.spec import Decline, Reason


def check(ctx) -> Decline | None:
    return Decline(Reason.NOT_IMPLEMENTED, "REPLACE_ME")


def activate(ctx) -> Decline | None:
    return check(ctx)
