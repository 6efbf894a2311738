"""The one Triton helper several op wheels' kernels share (imported by kernels only, never on the plugin's
import path: it imports triton)."""

import os

import triton
import triton.language as tl


def fp32_dot() -> bool:
    """The value to pass as ``FP32_DOT``: True under Triton's CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def dot(a, b, acc, FP32_DOT: tl.constexpr):
    """acc + a @ b. FP32_DOT: upcast first (Triton's CPU interpreter has no bf16 arithmetic: its bf16
    tl.dot multiplies raw bits); on GPUs the bf16/fp16 tensor-core dot with fp32 accumulation."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)
