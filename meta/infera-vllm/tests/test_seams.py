"""Every installed op activated against the real vLLM (the CPU build, kernels under Triton's interpreter) and
undone through infera_vllm.seams leaves vLLM as it found it: the same object under every name of every vLLM
module, class and module-level dict loaded before, and in the IR ops' providers; and every change a seam
makes is recorded there, once per process."""

import json

import pytest

from conftest import run_python

SCRIPT = r"""
import json, sys, types
from vllm import ir
from vllm.platforms import current_platform

from infera_vllm import activation, seams
from infera_vllm.switches import Switches
# what the ops' activation imports, imported first: vLLM registers its own IR providers on import
import infera_ops.attn_paged.seam, infera_ops.linear_hipblaslt.seam, infera_ops.moe_decode.seam
import infera_ops.norm.seam

type(current_platform)  # resolved: the platform class is one of the owners
ABSENT = object()


def vllm_state(modules=None):
    # every name in every vLLM module loaded now (or in ``modules``), the attributes of the classes defined
    # there (their own: not what they inherit) and the entries of its dicts; and the IR ops' providers
    out = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or not isinstance(module, types.ModuleType) or \
                (modules is not None and name not in modules):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType) or attr == "__builtins__":
                continue
            out[f"{name}.{attr}"] = value
            if isinstance(value, type) and value.__module__ == name:
                out.update({f"{name}.{attr}.{a}": v for a, v in list(vars(value).items())})
            if isinstance(value, dict):
                out.update({f"{name}.{attr}[{k!r}]": v for k, v in list(value.items())})
    for op in (ir.ops.rms_norm, ir.ops.fused_add_rms_norm):
        out.update({f"{op.name}.impls[{k!r}]": v for k, v in op.impls.items()})
    return out


def changed(a, b):
    return sorted(k for k in a.keys() | b.keys() if a.get(k, ABSENT) is not b.get(k, ABSENT))


def activate():
    verdicts = activation.activate_all(Switches.from_env())
    return {v.name: v.line() for v in verdicts if not v.active}


out = {}
before = vllm_state()
modules = {name for name in sys.modules if name.startswith("vllm")}  # the ones activation imports are new
state = lambda: vllm_state(modules)
out["declined"] = activate()
active = state()
out["changed"] = changed(before, active)
out["recorded"] = sorted(str(c) for c in seams.changes())
out["ops"] = sorted({c.op for c in seams.changes()})
out["again"] = [activate(), changed(active, state()), len(seams.changes())]  # once per process
out["kept_by_undo_all"] = [str(c) for c in seams.undo_all()]
out["after_undo_all"] = changed(before, state())
activate()
out["reactivated"] = changed(before, state())
out["kept_by_undo"] = [str(c) for op in out["ops"] for c in seams.undo(op)]
out["after_undo"] = changed(before, state())
out["left"] = [str(c) for c in seams.changes()]
print("RESULT" + json.dumps(out))
"""

OPS = ("attn-paged", "linear-hipblaslt", "moe-decode", "norm")


@pytest.mark.cpu_build  # every op activates on the CPU build under the interpreter
def test_every_op_undone_leaves_vllm_as_it_was(tmp_path):
    proc = run_python(SCRIPT, fixture_ops=False, env={
        "TRITON_INTERPRET": "1", "INFERA_VLLM_REPORT_DIR": str(tmp_path), "INFERA_VLLM_SELF_CHECK": "off",
        "INFERA_VLLM_OPS": ",".join(OPS),  # named: linear is opt-in, and norm goes first in the default priority
        "INFERA_ATTN_PAGED_DEFAULT": "1"})  # the platform's automatic attention choice wrapped too
    out = json.loads(proc.stdout.split("RESULT")[-1].splitlines()[0])
    assert out["declined"] == {}
    assert out["ops"] == sorted([*OPS, "infera-vllm"])  # the plugin's compile-cache factor too
    assert out["changed"] == sorted([
        "vllm.model_executor.layers.linear.dispatch_unquantized_gemm",
        "vllm.model_executor.layers.vocab_parallel_embedding.dispatch_unquantized_gemm",
        "vllm.platforms.cpu.CpuPlatform.get_attn_backend_cls",
        "vllm.platforms.cpu.CpuPlatform.get_default_ir_op_priority",
        "vllm.v1.attention.backends.registry._ATTN_OVERRIDES[<AttentionBackendEnum.CUSTOM: None>]",
        "vllm.model_executor.custom_op.op_registry_oot['UnquantizedFusedMoEMethod']",
        "vllm.model_executor.layers.fused_moe.oracle.fp8.backend_to_kernel_cls",
        "rms_norm.impls['infera']", "fused_add_rms_norm.impls['infera']",
        "vllm.envs.environment_variables['INFERA_VLLM_COMPILED_OPS']"])
    assert len(out["recorded"]) == len(out["changed"]), out["recorded"]  # each change recorded, once
    assert out["again"] == [{}, [], len(out["changed"])]
    assert out["kept_by_undo_all"] == [] and out["after_undo_all"] == []
    assert out["reactivated"] == out["changed"]
    assert out["kept_by_undo"] == [] and out["after_undo"] == [] and out["left"] == []
