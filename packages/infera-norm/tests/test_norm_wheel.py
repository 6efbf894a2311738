from infera_ops.norm.spec import SPEC
from infera_vllm.spec import Reason
from infera_vllm.testing import OpWheelContract


class TestNormWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.norm.spec"
    expected_decline = Reason.NOT_IMPLEMENTED  # placeholder until its kernel lands
