"""The one Triton helper several op wheels' kernels share (imported by kernels only, never on the plugin's
import path: it imports triton)."""

import functools
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
