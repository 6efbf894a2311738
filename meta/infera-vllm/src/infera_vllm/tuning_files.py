"""Where an op's per-GPU-family tuning data comes from, read here for every op: the file the op's path switch
names, else the ``tuning/<family>.json`` its wheel ships. Each op parses the text into its own format and
raises its own error type (the op's seam turns it into a decline), so a message names the switch, the path
or the file, and what is wrong.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def load(package: str, family: str, env_var: str, override: str | None, parse: Callable[[str, str], T],
         error: type[Exception]) -> T | None:
    """``parse(text, source)`` of the family's tuning file, or None when neither the switch nor the wheel has
    one. ``override``: the value of the op's path switch ``env_var`` (``switches.op_value``; None: not set);
    ``source`` is that path, or ``tuning/<family>.json`` for the file in ``package``. A path that cannot be
    read raises ``error`` naming the switch and the path."""
    if override:
        try:
            with open(override) as f:
                text = f.read()
        except OSError as exc:
            raise error(f"{env_var}={override!r}: {exc.strerror}") from exc
        return parse(text, override)
    packaged = resources.files(package).joinpath("tuning", f"{family}.json")
    return parse(packaged.read_text(), f"tuning/{family}.json") if packaged.is_file() else None


def document(text: str, source: str, error: type[Exception]) -> Any:
    """The JSON in ``text``; ``error`` naming ``source`` when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{source}: not JSON ({exc})") from exc
