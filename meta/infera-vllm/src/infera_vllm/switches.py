"""The environment switches, read in one place.

``INFERA_VLLM_OPS_DISABLE=1``   every op off; vLLM runs as if the plugin were not installed.
``INFERA_VLLM_OPS=a,b``         allow-list: only these ops (the only way to turn on an opt-in op); any case.
``INFERA_VLLM_OPS_EXCLUDE=a,b`` deny-list, applied after the allow-list.
``INFERA_VLLM_STRICT=1``        every decline, at startup or per call, raises instead of falling back.
``INFERA_VLLM_REPORT_DIR=DIR``  where each process writes its coverage report.
``INFERA_VLLM_SELF_CHECK=first`` the numerics self-check: on/first (default), off, every, or a rate in (0, 1).

An op's own switches are declared in its spec (``OpSpec.switches``, :class:`~infera_vllm.spec.Switch`) and
parsed here by one set of rules (``parse``): the plugin reads them before the op's ``check`` and declines the
op ``bad-switch`` on a value the rules refuse; the op reads them through ``op_value``.
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from infera_vllm.spec import SWITCH_KINDS, Decline, OpSpec, Reason, Switch

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


def triton_interpreter(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``TRITON_INTERPRET`` turns Triton's interpreter on, read as Triton reads it (1, true, yes, on,
    y in any case), so the ops decide as Triton runs."""
    raw = (os.environ if env is None else env).get("TRITON_INTERPRET", "")
    return raw.strip().lower() in ("1", "true", "yes", "on", "y")


class SwitchError(ValueError):
    """An environment switch has a value we refuse to guess about."""


def _parse_flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise SwitchError(f"{name}={raw!r}: expected {allowed_values(Switch(name, 'flag'))}")


def _flag(env: Mapping[str, str], name: str) -> bool:
    return _parse_flag(name, env.get(name, ""))


def _names(env: Mapping[str, str], name: str) -> frozenset[str] | None:
    """The comma-separated op names of ``name`` in lower case (op names are; the user's case does not
    matter, as for the ops' choice switches); None where unset or blank."""
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return frozenset(part.strip().lower() for part in raw.split(",") if part.strip())


def did_you_mean(name: str, known) -> str:
    """`` (did you mean 'norm'?)`` where one of ``known`` is close to ``name`` (a typo), else ''."""
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


SELF_CHECK_VALUES = "on/off (1/0, true/false, yes/no; on is first), first, every, or a rate in (0, 1) such as 0.01"


def _self_check_mode(env: Mapping[str, str]) -> str:
    """``off``, ``first`` (the default, and what any flag's on value means), ``every`` (every eager call), or a
    sampling rate as text (``0.01``): strictly between 0 and 1, so ``1`` is the flag, never a rate."""
    raw = env.get("INFERA_VLLM_SELF_CHECK", "")
    value = raw.strip().lower()
    if value in ("", "first") or value in _TRUE:
        return "first"
    if value in _FALSE or value in ("off", "none"):
        return "off"
    if value == "every":
        return "every"
    try:
        rate = float(value)
    except ValueError:
        rate = -1.0
    if not 0.0 < rate < 1.0:
        hint = " (every call: every)" if rate >= 1.0 else ""
        raise SwitchError(f"INFERA_VLLM_SELF_CHECK={raw!r}: expected {SELF_CHECK_VALUES}{hint}")
    return repr(rate)


@dataclass(frozen=True)
class Switches:
    disable_all: bool = False
    allow: frozenset[str] | None = None  # None: no allow-list
    exclude: frozenset[str] = frozenset()
    strict: bool = False
    report_dir: str | None = None
    self_check: str = "first"  # "off", "first", "every", or a rate as text ("0.01")
    self_check_perturb: str = ""

    @property
    def self_check_rate(self) -> float:
        """0 for off and first; the sampling rate of later eager calls otherwise (every: 1)."""
        if self.self_check == "every":
            return 1.0
        return 0.0 if self.self_check in ("off", "first") else float(self.self_check)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Switches:
        env = os.environ if env is None else env
        return cls(
            disable_all=_flag(env, "INFERA_VLLM_OPS_DISABLE"),
            allow=_names(env, "INFERA_VLLM_OPS"),
            exclude=_names(env, "INFERA_VLLM_OPS_EXCLUDE") or frozenset(),
            strict=_flag(env, "INFERA_VLLM_STRICT"),
            report_dir=env.get("INFERA_VLLM_REPORT_DIR") or None,
            self_check=_self_check_mode(env),
            self_check_perturb=env.get("INFERA_VLLM_SELF_CHECK_PERTURB", "").strip().lower(),
        )

    def selection(self, spec: OpSpec) -> Decline | None:
        """Whether the switches let ``spec`` be tried at all (``None``) or why not."""
        if self.disable_all:
            return Decline(Reason.DISABLED, "INFERA_VLLM_OPS_DISABLE=1")
        name = spec.name.lower()
        if self.allow is not None and name not in self.allow:
            return Decline(Reason.NOT_REQUESTED, f"INFERA_VLLM_OPS does not name {spec.name!r}")
        if name in self.exclude:
            return Decline(Reason.EXCLUDED, "named in INFERA_VLLM_OPS_EXCLUDE")
        if self.allow is None and not spec.default_on:
            return Decline(Reason.NOT_REQUESTED, f"opt-in: add {spec.name!r} to INFERA_VLLM_OPS to use it")
        return None

    def requested_explicitly(self, name: str) -> bool:
        name = name.lower()
        return self.allow is not None and name in self.allow and name not in self.exclude

    def unknown_names(self, installed, lists=("INFERA_VLLM_OPS", "INFERA_VLLM_OPS_EXCLUDE")) -> list[str]:
        """One line per name in the switches ``lists`` (INFERA_VLLM_OPS, INFERA_VLLM_OPS_EXCLUDE) that no
        installed wheel provides, with a "did you mean" where an installed op's name is close: what serving
        warns and doctor flags."""
        lines = []
        names_of = {"INFERA_VLLM_OPS": self.allow or frozenset(), "INFERA_VLLM_OPS_EXCLUDE": self.exclude}
        for switch, names in ((switch, names_of[switch]) for switch in lists):
            for name in sorted(names - set(installed)):
                lines.append(f"{switch} names {name!r}, which no installed wheel provides"
                             + did_you_mean(name, installed))
        return lines

    def describe(self) -> dict[str, object]:
        return {
            "INFERA_VLLM_OPS_DISABLE": self.disable_all,
            "INFERA_VLLM_OPS": sorted(self.allow) if self.allow is not None else None,
            "INFERA_VLLM_OPS_EXCLUDE": sorted(self.exclude),
            "INFERA_VLLM_STRICT": self.strict,
            "INFERA_VLLM_REPORT_DIR": self.report_dir,
            "INFERA_VLLM_SELF_CHECK": self.self_check,
            **({"INFERA_VLLM_SELF_CHECK_PERTURB": self.self_check_perturb} if self.self_check_perturb else {}),
        }


_INTEGER = re.compile(r"[+-]?[0-9]+")


def allowed_values(switch: Switch) -> str:
    """The values ``switch`` accepts, as the error messages, doctor and docs/switches.md write them."""
    if switch.kind == "flag":
        return "1/0, true/false, yes/no or on/off"
    if switch.kind == "int":
        return "an integer" + (f" >= {switch.minimum}" if switch.minimum is not None else "")
    if switch.kind == "choice":
        return "one of " + ", ".join(switch.choices)
    return "a file path"


def default_text(switch: Switch) -> str:
    """The default as a user would write it: ``0``/``1`` for flags, ``unset`` where there is none."""
    if switch.default is None:
        return "unset"
    if switch.kind == "flag":
        return "1" if switch.default else "0"
    return str(switch.default)


@functools.lru_cache(maxsize=256)
def parse(switch: Switch, raw: str | None) -> bool | int | str | None:
    """The value of ``switch`` for the environment string ``raw`` (None: not set). Unset or blank is the
    default; anything the kind's rule refuses is a :class:`SwitchError` naming the switch, the value and
    what it accepts. Cached by (switch, raw): ops may read a switch on every call."""
    if raw is None or not raw.strip():
        return switch.default
    if switch.kind == "flag":
        return _parse_flag(switch.name, raw)
    value = raw.strip()
    if switch.kind == "int":
        if _INTEGER.fullmatch(value) and (switch.minimum is None or int(value) >= switch.minimum):
            return int(value)
    elif switch.kind == "choice":
        for choice in switch.choices:
            if choice.lower() == value.lower():
                return choice
    elif switch.kind == "path":
        return value
    else:
        raise SwitchError(f"{switch.name}: unknown switch kind {switch.kind!r} (one of {', '.join(SWITCH_KINDS)})")
    raise SwitchError(f"{switch.name}={raw!r}: expected {allowed_values(switch)}")


def switch_problem(switch: object) -> str | None:
    """What makes a declared switch unusable (the plugin declines its op ``spec-error`` with it), or None."""
    if not isinstance(switch, Switch):
        return f"{switch!r} is not a Switch"
    name = switch.name
    if not isinstance(name, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", name) or name.startswith("INFERA_VLLM_"):
        return f"switch name {name!r} must be an upper-case environment variable outside INFERA_VLLM_*"
    try:
        hash(switch)
    except TypeError:
        return f"{name}: its fields must be hashable (choices a tuple, not a list)"
    if switch.kind not in SWITCH_KINDS:
        return f"{name}: kind {switch.kind!r} is not one of {', '.join(SWITCH_KINDS)}"
    default = switch.default
    if switch.kind == "flag" and not isinstance(default, bool):
        return f"{name}: a flag's default must be True or False, not {default!r}"
    if switch.kind == "int":
        if default is not None and (isinstance(default, bool) or not isinstance(default, int)):
            return f"{name}: an int switch's default must be an int or None, not {default!r}"
        if switch.minimum is not None and default is not None and default < switch.minimum:
            return f"{name}: default {default} is below its minimum {switch.minimum}"
    if switch.kind == "choice":
        if not switch.choices or not all(isinstance(c, str) and c.strip() for c in switch.choices):
            return f"{name}: a choice switch needs its choices (non-empty strings)"
        if default not in switch.choices:
            return f"{name}: default {default!r} is not among its choices ({', '.join(switch.choices)})"
    if switch.kind == "path" and default is not None and not isinstance(default, str):
        return f"{name}: a path switch's default must be a string or None, not {default!r}"
    return None


def op_values(spec: OpSpec, env: Mapping[str, str] | None = None) -> dict[str, bool | int | str | None]:
    """Every switch ``spec`` declares, parsed from ``env`` (default: this process's environment). One
    :class:`SwitchError` lists every value refused, each with what its switch accepts."""
    env = os.environ if env is None else env
    values: dict[str, bool | int | str | None] = {}
    problems: list[str] = []
    for switch in spec.switches:
        try:
            values[switch.name] = parse(switch, env.get(switch.name))
        except SwitchError as exc:
            problems.append(str(exc))
    if problems:
        raise SwitchError("; ".join(problems))
    return values


def op_value(spec: OpSpec, name: str, env: Mapping[str, str] | None = None) -> bool | int | str | None:
    """The value of the switch ``name`` that ``spec`` declares, from ``env`` (default: this process's
    environment), by the same rules the plugin checked it with before the op's ``check``. A name the spec
    does not declare is a LookupError (the op's own mistake); a bad value a :class:`SwitchError`."""
    for switch in spec.switches:
        if switch.name == name:
            return parse(switch, (os.environ if env is None else env).get(name))
    raise LookupError(f"op {spec.name!r} declares no switch {name!r} (declared: "
                      f"{', '.join(s.name for s in spec.switches) or 'none'})")
