"""The seam of an op whose kernel has not landed: it declines ``not-implemented`` and installs nothing,
so the whole plugin path (discovery, checks, import, activation, reports) runs and vLLM serves every call."""

from __future__ import annotations

from infera_vllm.spec import Decline, Reason


def not_implemented(detail: str):
    """``check, activate = not_implemented("...")`` in an op's seam module."""
    why = Decline(Reason.NOT_IMPLEMENTED, f"{detail}; vLLM's own kernel serves every call")

    def check(ctx) -> Decline | None:
        return why

    def activate(ctx) -> Decline | None:
        return why

    return check, activate
