"""The Triton helpers several op wheels' kernels share (imported by kernels, and by the plugin only under
Triton's interpreter, never on its import path: it imports triton)."""

import functools

import triton
import triton.language as tl

from infera_vllm.switches import triton_interpreter


def fp32_dot() -> bool:
    """The value to pass as ``FP32_DOT``: True under Triton's CPU interpreter."""
    return triton_interpreter()


@triton.jit
def dot(a, b, acc, FP32_DOT: tl.constexpr):
    """acc + a @ b. FP32_DOT: upcast first (Triton's CPU interpreter has no bf16 arithmetic: its bf16
    tl.dot multiplies raw bits); on GPUs the bf16/fp16 tensor-core dot with fp32 accumulation."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


def pdl_supported(device) -> bool:
    """Programmatic dependent launch (``launch_pdl``, ``gdc_wait``/``gdc_launch_dependents``): NVIDIA Hopper or
    later, a Triton that has it, and not Triton's interpreter (ROCm's torch also says ``cuda``, with its own
    capability numbers: never there). Decided once per device (ops ask on every call)."""
    return device.type == "cuda" and not fp32_dot() and _pdl_on_cuda_device(device.index)


@functools.lru_cache(maxsize=None)
def _pdl_on_cuda_device(index) -> bool:
    import torch

    if torch.version.hip is not None or torch.cuda.get_device_capability(index)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        return False
    return "launch_pdl" in getattr(CUDAOptions, "__dataclass_fields__", {})


def round_bf16_like_gpus() -> bool:
    """Under Triton's interpreter (``TRITON_INTERPRET=1``, the kernels' CPU validation), make its fp32 -> bf16
    conversion round to nearest even, as GPUs and torch do. Triton's interpreter truncates there
    (``InterpreterBuilder.cast_impl`` passes no rounding mode; its explicit ``rtne`` path drops the carry into
    the exponent): measured with Triton 3.9, half of random values convert differently from torch and all of
    them equal truncation. Truncation pulls every bf16 result towards zero by half a unit on average, a bias
    that compounds over a model's layers, so without this a kernel agrees less with vLLM's CPU kernels under
    the interpreter than on a GPU. Replaces those two conversions once per process (NaN stays NaN); returns
    whether the interpreter is in use."""
    if not fp32_dot():
        return False
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.cast_impl, "_infera_rne", False):
        return True
    cast_impl, fp_to_fp = builder.cast_impl, builder.create_fp_to_fp

    def to_bf16(src, dst_type):
        values = np.ascontiguousarray(src.data, dtype=np.float32)
        bits = values.view(np.uint32)
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
        quiet_nan = (bits >> np.uint32(16)) | np.uint32(0x40)
        data = np.where(np.isnan(values), quiet_nan, rounded).astype(np.uint16)
        return interpreter.TensorHandle(data, dst_type.scalar)

    def rounding_cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            return to_bf16(src, dst_type)
        return cast_impl(self, src, dst_type)

    def rounding_fp_to_fp(self, src, dst_type, rounding_mode):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16 and rounding_mode != \
                interpreter._ir.ROUNDING_MODE.RTZ:
            return to_bf16(src, dst_type)
        return fp_to_fp(self, src, dst_type, rounding_mode)

    rounding_cast._infera_rne = True
    builder.cast_impl = rounding_cast
    builder.create_fp_to_fp = rounding_fp_to_fp
    return True
