import os

import torch

from infera_ops.norm.spec import SPEC
from infera_vllm.testing import OpWheelContract


class TestNormWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.norm.spec"
    # On the CPU the kernels need Triton's interpreter, which only the kernel test run switches on.
    expected_decline = (None if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
                        else "triton-interpreter-off")
