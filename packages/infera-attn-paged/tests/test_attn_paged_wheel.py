from infera_ops.attn_paged.spec import SPEC
from infera_vllm.spec import Reason
from infera_vllm.testing import OpWheelContract


class TestAttnPagedWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.attn_paged.spec"
    expected_decline = Reason.NOT_IMPLEMENTED  # placeholder until its kernel lands
