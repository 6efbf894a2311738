"""Placeholder seam: declines honestly until the tuned BLASLt linear lands (issue #6).

It runs the whole plugin path (discovery, checks, import, activation, the coverage report) and installs
nothing, so vLLM's own kernel serves every call.
"""

from infera_vllm.spec import Decline, Reason

_WHY = Decline(Reason.NOT_IMPLEMENTED, "the tuned BLASLt linear lands with issue #6; vLLM's own kernel serves every call")


def check(ctx) -> Decline | None:
    return _WHY


def activate(ctx) -> Decline | None:
    return check(ctx)
