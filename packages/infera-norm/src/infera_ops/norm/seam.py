"""Placeholder seam: declines honestly until the Triton RMSNorm kernel lands (issue #3).

It runs the whole plugin path (discovery, checks, import, activation, the coverage report) and installs
nothing, so vLLM's own kernel serves every call.
"""

from infera_vllm.spec import Decline, Reason

_WHY = Decline(Reason.NOT_IMPLEMENTED, "the Triton RMSNorm kernel lands with issue #3; vLLM's own kernel serves every call")


def check(ctx) -> Decline | None:
    return _WHY


def activate(ctx) -> Decline | None:
    return check(ctx)
