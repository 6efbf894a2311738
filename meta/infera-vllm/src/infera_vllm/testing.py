"""Checks every op wheel's tests share (test-only helpers; nothing here runs in vLLM)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

from infera_vllm.spec import ENTRY_POINT_GROUP, OpSpec

HEAVY = ("torch", "triton", "vllm")


def modules_imported_by(module: str) -> set[str]:
    """Top-level packages a fresh interpreter has loaded after ``import module``."""
    code = f"import json, sys; import {module}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def assert_import_light(module: str) -> None:
    heavy = modules_imported_by(module) & set(HEAVY)
    assert not heavy, f"importing {module} pulled in {sorted(heavy)}; spec modules must stay plain data"


def assert_advertised(spec: OpSpec) -> None:
    """The installed distribution advertises exactly this spec under its name in ``infera_vllm.ops``."""
    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == spec.name]
    assert len(eps) == 1, f"expected one {ENTRY_POINT_GROUP} entry point named {spec.name!r}, found {eps}"
    assert eps[0].load() is spec
    assert eps[0].dist is not None and eps[0].dist.metadata["Name"] == spec.distribution
    requires = eps[0].dist.requires or []
    assert any(r.startswith("infera-vllm") for r in requires), f"{spec.distribution} must depend on infera-vllm"


class OpWheelContract:
    """Tests every op wheel passes against the real installed vLLM; subclass in the wheel's tests with
    ``spec`` and ``spec_module`` set (pytest collects the inherited ``test_*`` methods)."""

    spec: OpSpec
    spec_module: str
    expected_decline: str | None = None  # a placeholder op sets "not-implemented"

    def test_spec_module_is_import_light(self):
        assert_import_light(self.spec_module)

    def test_advertised_through_entry_point(self):
        assert_advertised(self.spec)

    def test_compatible_with_installed_vllm(self):
        from infera_vllm import compat

        env = compat.Environment.detect()
        assert compat.check(self.spec, env) is None, compat.check(self.spec, env)

    def test_activation_verdict(self):
        from infera_vllm import activation, compat, discovery
        from infera_vllm.switches import Switches

        (found,) = [f for f in discovery.discover() if f.name == self.spec.name]
        verdict = activation.evaluate(found, compat.Environment.detect(), Switches(allow=frozenset({self.spec.name})),
                                      install=False)
        if self.expected_decline is None:
            assert verdict.active, verdict.line()
        else:
            assert verdict.decline is not None and verdict.decline.code == self.expected_decline, verdict.line()


def run_script(script: str, *args: str, env: dict[str, str]) -> str:
    """Run a Python script in a fresh interpreter (vLLM spawns more processes from it), with ``env`` over this
    process's environment; its stdout, or an AssertionError carrying the failure's tail."""
    import os

    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc.stdout


def result_json(stdout: str, tag: str = "RESULT"):
    """The JSON a script printed after ``tag`` on its last such line (vLLM may log after it)."""
    return json.loads(stdout.split(tag)[-1].splitlines()[0])
