"""Find the installed operator wheels through the ``infera_vllm.ops`` entry-point group.

Loading an entry point imports only the op's spec module (plain data); a spec that fails to load, is not
an :class:`~infera_vllm.spec.OpSpec`, or has a field that cannot be used (a malformed version range, say:
``compat.spec_problem``) becomes a ``spec-error`` decline naming what is wrong, instead of an exception.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from infera_vllm import compat
from infera_vllm.spec import ENTRY_POINT_GROUP, Decline, OpSpec, Reason


@dataclass(frozen=True)
class Found:
    name: str  # the entry-point name; equals spec.name when the spec loaded
    distribution: str
    version: str
    spec: OpSpec | None
    problem: Decline | None = None


def discover(group: str = ENTRY_POINT_GROUP) -> list[Found]:
    found: list[Found] = []
    seen: dict[str, str] = {}
    for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        dist_name = dist.metadata["Name"] if dist is not None else "?"
        dist_version = dist.version if dist is not None else "?"
        if ep.name in seen:
            found.append(Found(ep.name, dist_name, dist_version, None,
                               Decline(Reason.DUPLICATE, f"{dist_name} and {seen[ep.name]} both provide {ep.name!r}")))
            continue
        seen[ep.name] = dist_name
        try:
            spec = ep.load()
        except Exception as exc:
            found.append(Found(ep.name, dist_name, dist_version, None,
                               Decline(Reason.SPEC_ERROR,
                                       f"entry point {ep.value} failed: {type(exc).__name__}: {exc}")))
            continue
        if not isinstance(spec, OpSpec):
            found.append(Found(ep.name, dist_name, dist_version, None,
                               Decline(Reason.SPEC_ERROR,
                                       f"entry point {ep.value} is a {type(spec).__name__}, not an OpSpec")))
            continue
        if spec.name != ep.name:
            found.append(Found(ep.name, dist_name, dist_version, None,
                               Decline(Reason.SPEC_ERROR,
                                       f"entry point {ep.name!r} carries a spec named {spec.name!r}")))
            continue
        problem = compat.spec_problem(spec)
        if problem is not None:
            found.append(Found(ep.name, dist_name, dist_version, None, problem))
            continue
        found.append(Found(ep.name, dist_name, dist_version, spec))
    return found
