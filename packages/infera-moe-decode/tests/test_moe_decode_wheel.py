import os

from infera_ops.moe_decode.spec import SPEC
from infera_vllm.testing import OpWheelContract


def _expected() -> str | None:
    from infera_ops.moe_decode import policy
    from infera_vllm.platform import detect_gpu_family

    family, _ = detect_gpu_family()
    if family == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return "triton-interpreter-off"  # on the CPU the kernels need Triton's interpreter
    return None if policy.load(family) is not None else "not-tuned"


class TestMoeDecodeWheel(OpWheelContract):
    spec = SPEC
    spec_module = "infera_ops.moe_decode.spec"
    expected_decline = _expected()
