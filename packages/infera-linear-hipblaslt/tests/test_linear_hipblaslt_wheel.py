from infera_ops.linear_hipblaslt.spec import SPEC
from infera_vllm.spec import Reason
from infera_vllm.testing import OpWheelContract


class TestLinearHipblasltWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.linear_hipblaslt.spec"
    expected_decline = Reason.NOT_IMPLEMENTED  # placeholder until its kernel lands


def test_opt_in_stays_off_unless_named():
    from infera_vllm.switches import Switches

    assert SPEC.default_on is False
    assert Switches().selection(SPEC).code == Reason.NOT_REQUESTED
    assert Switches(allow=frozenset({"linear-hipblaslt"})).selection(SPEC) is None
