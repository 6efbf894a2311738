import os

from infera_ops.linear_hipblaslt.spec import SPEC
from infera_vllm.testing import OpWheelContract


def _expected() -> str | None:
    from infera_ops.linear_hipblaslt import policy
    from infera_vllm.platform import detect_gpu_family

    family, _ = detect_gpu_family()
    if family == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "triton-interpreter-off"  # on the CPU the kernel needs Triton's interpreter
    return None if policy.load(family) is not None else "not-tuned"


class TestLinearHipblasltWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.linear_hipblaslt.spec"
    expected_decline = _expected()


def test_opt_in_stays_off_unless_named():
    from infera_vllm.spec import Reason
    from infera_vllm.switches import Switches

    assert SPEC.default_on is False
    assert Switches().selection(SPEC).code == Reason.NOT_REQUESTED
    assert Switches(allow=frozenset({"linear-hipblaslt"})).selection(SPEC) is None
