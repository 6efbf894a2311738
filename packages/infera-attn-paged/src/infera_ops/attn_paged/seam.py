"""Placeholder seam: declines honestly until the paged-attention backend lands (issue #4).

It runs the whole plugin path (discovery, checks, import, activation, the coverage report) and installs
nothing, so vLLM's own kernel serves every call.
"""

from infera_vllm.spec import Decline, Reason

_WHY = Decline(Reason.NOT_IMPLEMENTED, "the paged-attention backend lands with issue #4; vLLM's own kernel serves every call")


def check(ctx) -> Decline | None:
    return _WHY


def activate(ctx) -> Decline | None:
    return check(ctx)
