from infera_ops.REPLACE_ME_MODULE.spec import SPEC
from infera_vllm.spec import Reason
from infera_vllm.testing import OpWheelContract


class TestREPLACE_ME_Wheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.REPLACE_ME_MODULE.spec"
    expected_decline = Reason.NOT_IMPLEMENTED  # set to None once activate() installs the seam
