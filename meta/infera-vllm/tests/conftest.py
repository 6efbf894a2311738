import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE_SITE = Path(__file__).parent / "fixture_site"
_SWITCHES = ("INFERA_VLLM_OPS_DISABLE", "INFERA_VLLM_OPS", "INFERA_VLLM_OPS_EXCLUDE", "INFERA_VLLM_STRICT",
             "INFERA_VLLM_REPORT_DIR", "INFERA_VLLM_SELF_CHECK", "INFERA_VLLM_SELF_CHECK_PERTURB", "INFERA_VLLM_RUN")


@pytest.fixture(autouse=True)
def _clean_switches(monkeypatch):
    for name in _SWITCHES:
        monkeypatch.delenv(name, raising=False)


def run_python(code: str, *, env: dict | None = None, fixture_ops: bool = True, check: bool = True,
               args: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """A fresh interpreter, as vLLM's own processes are, optionally with the fixture op wheels installed."""
    full = {k: v for k, v in os.environ.items() if k not in _SWITCHES}
    if fixture_ops:
        full["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FIXTURE_SITE), full.get("PYTHONPATH")]))
    full.update(env or {})
    cmd = [sys.executable, *(["-c", code] if code else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def reports(directory) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("infera-*.json"))]


def ops_by_name(report: dict) -> dict[str, dict]:
    return {o["op"]: o for o in report["ops"]}
