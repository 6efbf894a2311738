"""Placeholder seam: declines honestly until the decode MoE experts kernel lands (issue #5).

It runs the whole plugin path (discovery, checks, import, activation, the coverage report) and installs
nothing, so vLLM's own kernel serves every call.
"""

from infera_vllm.spec import Decline, Reason

_WHY = Decline(Reason.NOT_IMPLEMENTED, "the decode MoE experts kernel lands with issue #5; vLLM's own kernel serves every call")


def check(ctx) -> Decline | None:
    return _WHY


def activate(ctx) -> Decline | None:
    return check(ctx)
