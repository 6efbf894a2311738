"""The environment switches, read in one place.

``INFERA_VLLM_OPS_DISABLE=1``   every op off; vLLM runs as if the plugin were not installed.
``INFERA_VLLM_OPS=a,b``         allow-list: only these ops (the only way to turn on an opt-in op).
``INFERA_VLLM_OPS_EXCLUDE=a,b`` deny-list, applied after the allow-list.
``INFERA_VLLM_STRICT=1``        every decline, at startup or per call, raises instead of falling back.
``INFERA_VLLM_REPORT_DIR=DIR``  where each process writes its coverage report.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from infera_vllm.spec import Decline, OpSpec, Reason

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class SwitchError(ValueError):
    """An environment switch has a value we refuse to guess about."""


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SwitchError(f"{name}={env[name]!r}: expected 1/0, true/false, yes/no or on/off")


def _names(env: Mapping[str, str], name: str) -> frozenset[str] | None:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return None
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


@dataclass(frozen=True)
class Switches:
    disable_all: bool = False
    allow: frozenset[str] | None = None  # None: no allow-list
    exclude: frozenset[str] = frozenset()
    strict: bool = False
    report_dir: str | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Switches:
        env = os.environ if env is None else env
        return cls(
            disable_all=_flag(env, "INFERA_VLLM_OPS_DISABLE"),
            allow=_names(env, "INFERA_VLLM_OPS"),
            exclude=_names(env, "INFERA_VLLM_OPS_EXCLUDE") or frozenset(),
            strict=_flag(env, "INFERA_VLLM_STRICT"),
            report_dir=env.get("INFERA_VLLM_REPORT_DIR") or None,
        )

    def selection(self, spec: OpSpec) -> Decline | None:
        """Whether the switches let ``spec`` be tried at all (``None``) or why not."""
        if self.disable_all:
            return Decline(Reason.DISABLED, "INFERA_VLLM_OPS_DISABLE=1")
        if self.allow is not None and spec.name not in self.allow:
            return Decline(Reason.NOT_REQUESTED, f"INFERA_VLLM_OPS does not name {spec.name!r}")
        if spec.name in self.exclude:
            return Decline(Reason.EXCLUDED, "named in INFERA_VLLM_OPS_EXCLUDE")
        if self.allow is None and not spec.default_on:
            return Decline(Reason.NOT_REQUESTED, f"opt-in: add {spec.name!r} to INFERA_VLLM_OPS to use it")
        return None

    def requested_explicitly(self, name: str) -> bool:
        return self.allow is not None and name in self.allow and name not in self.exclude

    def describe(self) -> dict[str, object]:
        return {
            "INFERA_VLLM_OPS_DISABLE": self.disable_all,
            "INFERA_VLLM_OPS": sorted(self.allow) if self.allow is not None else None,
            "INFERA_VLLM_OPS_EXCLUDE": sorted(self.exclude),
            "INFERA_VLLM_STRICT": self.strict,
            "INFERA_VLLM_REPORT_DIR": self.report_dir,
        }
