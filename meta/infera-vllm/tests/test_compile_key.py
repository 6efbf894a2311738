"""The active ops enter vLLM's own torch.compile cache key (compile_key.py), so a graph compiled with a
different set of ops (plugin off, above all) is never loaded for this one: checked on vLLM's real
``compile_factors()``, the function its Inductor and AOT-compile caches hash."""

import json

import pytest

from conftest import run_python

FACTORS = """
import json
from vllm.plugins import load_general_plugins
load_general_plugins()
import vllm.envs as envs
print("FACTORS" + json.dumps({k: str(v) for k, v in envs.compile_factors().items()}))
"""


def _factors(tmp_path, **env):
    proc = run_python(FACTORS, env={"INFERA_VLLM_REPORT_DIR": str(tmp_path), **env})
    return json.loads(proc.stdout.split("FACTORS")[-1].splitlines()[0])


@pytest.mark.cpu_build  # asserts the CPU build's verdicts (Triton ops decline there)
def test_active_ops_are_in_vllms_compile_factors(tmp_path):
    on = _factors(tmp_path)
    key = on["INFERA_VLLM_COMPILED_OPS"]
    assert "fixture-good=" in key and "norm" not in key  # active ops only (norm declines on the CPU here)
    off = _factors(tmp_path, INFERA_VLLM_OPS_DISABLE="1")
    assert "INFERA_VLLM_COMPILED_OPS" not in off  # plugin off: vLLM's own key, unchanged
    assert {k: v for k, v in on.items() if k != "INFERA_VLLM_COMPILED_OPS"} == off
    other = _factors(tmp_path, INFERA_VLLM_OPS_EXCLUDE="fixture-good")
    assert other.get("INFERA_VLLM_COMPILED_OPS") != key  # another set of ops, another key
