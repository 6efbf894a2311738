"""The vLLM general-plugin entry point.

vLLM calls ``register()`` in every process it starts (front end, engine core, each worker; fork or
spawn). This module imports only the standard library and the plugin's own light modules; everything that
touches vLLM, torch or an op happens inside ``register()``.
"""

from __future__ import annotations

import os

_registered_pid: int | None = None


def register() -> None:
    """Idempotent per process; never lets an op's failure stop vLLM unless INFERA_VLLM_STRICT=1."""
    global _registered_pid
    if _registered_pid is not None:
        # Same process: done. A forked child inherits the seams installed in its parent.
        return
    _registered_pid = os.getpid()

    from infera_vllm import log
    from infera_vllm.switches import Switches

    switches = Switches.from_env()  # a malformed switch is a clear error, not a guess
    if switches.disable_all:
        log.info("infera-vllm: INFERA_VLLM_OPS_DISABLE=1, every op is off; vLLM runs unchanged")
        return

    from infera_vllm import activation

    try:
        activation.activate_all(switches)
    except Exception:
        if switches.strict:
            raise
        log.logger.exception("infera-vllm: the plugin failed; vLLM continues with its own kernels")

    from infera_vllm import metrics

    metrics.install()  # a front end's /metrics also shows the merged coverage reports (never raises)
