"""Where an op's per-GPU-family tuning data comes from: the file an environment switch names, else the
``tuning/<family>.json`` the op's wheel ships. Read here once for every op; each op parses the text."""

from __future__ import annotations

from importlib import resources


class TuningFileError(ValueError):
    """The file the switch names cannot be read (the message names the switch and the path)."""


def read(package: str, family: str, env_var: str, override: str | None) -> tuple[str, str] | None:
    """(text, source) of the family's tuning file, or None when neither the switch nor the wheel has one.
    ``override`` is the value of the op's path switch ``env_var`` (``switches.op_value``; None: not set)."""
    if override:
        try:
            with open(override) as f:
                return f.read(), override
        except OSError as exc:
            raise TuningFileError(f"{env_var}={override!r}: {exc.strerror}") from exc
    packaged = resources.files(package).joinpath("tuning", f"{family}.json")
    return (packaged.read_text(), f"tuning/{family}.json") if packaged.is_file() else None
