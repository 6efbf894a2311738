"""The plugin's log lines, under vLLM's logger so they share its format and level.

vLLM 0.32 configures its logging lazily, after the front-end process has already loaded plugins, so at
startup the ``vllm`` logger may have no handler yet; Python would then drop INFO lines. Those lines are
the user's only sign of which ops activated, so until some handler exists they go to stderr. Once a
handler exists anywhere on the chain (vLLM's, or the user's own), its level is respected. A handler whose
stream is already closed (at interpreter exit, after a test runner's capture ended) counts as none.
"""

from __future__ import annotations

import logging
import os
import sys

logger = logging.getLogger("vllm.infera_vllm")


def _has_handler(log: logging.Logger) -> bool:
    current: logging.Logger | None = log
    while current is not None:
        if any(not getattr(getattr(h, "stream", None), "closed", False) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def _log(level: int, msg: str, args: tuple) -> None:
    if _has_handler(logger):
        logger.log(level, msg, *args, stacklevel=3)
    else:
        try:
            print(f"(pid {os.getpid()}) {logging.getLevelName(level)} {msg % args if args else msg}", file=sys.stderr,
                  flush=True)
        except (ValueError, OSError):  # stderr itself closed: a log line is not worth an error
            pass


def info(msg: str, *args: object) -> None:
    _log(logging.INFO, msg, args)


def warning(msg: str, *args: object) -> None:
    """Something the user did that did not do what they meant: a bad switch value, an op name no wheel
    provides, a decline they caused."""
    _log(logging.WARNING, msg, args)
