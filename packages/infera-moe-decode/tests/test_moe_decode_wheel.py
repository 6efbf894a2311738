from infera_ops.moe_decode.spec import SPEC
from infera_vllm.spec import Reason
from infera_vllm.testing import OpWheelContract


class TestMoeDecodeWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.moe_decode.spec"
    expected_decline = Reason.NOT_IMPLEMENTED  # placeholder until its kernel lands
