"""Where an op's per-GPU-family tuning data comes from: the file an environment switch names, else the
``tuning/<family>.json`` the op's wheel ships. Read here once for every op; each op parses the text."""

from __future__ import annotations

import os
from importlib import resources


class TuningFileError(ValueError):
    """The file the switch names cannot be read (the message names the switch and the path)."""


def read(package: str, family: str, env_var: str) -> tuple[str, str] | None:
    """(text, source) of the family's tuning file, or None when neither the switch nor the wheel has one."""
    override = os.environ.get(env_var, "").strip()
    if override:
        try:
            with open(override) as f:
                return f.read(), override
        except OSError as exc:
            raise TuningFileError(f"{env_var}={override!r}: {exc.strerror}") from exc
    packaged = resources.files(package).joinpath("tuning", f"{family}.json")
    return (packaged.read_text(), f"tuning/{family}.json") if packaged.is_file() else None
