"""GPU family detection without GPU work.

Families are the names the nox sessions and op specs use: ``cpu``, ``smXY`` for NVIDIA compute capability
X.Y (``sm90`` = Hopper), ``gfxNNNN`` for AMD. vLLM's ``current_platform`` answers through NVML / amdsmi,
so asking does not create a CUDA context in the front-end process (which would break forked workers).
"""

from __future__ import annotations


def detect_gpu_family() -> tuple[str | None, str]:
    """``(family, detail)``; family is ``None`` when it cannot be told, with the reason in ``detail``."""
    try:
        from vllm.platforms import current_platform
    except Exception as exc:  # vLLM missing or broken: the version check reports it
        return None, f"vllm.platforms does not import: {exc}"
    try:
        if current_platform.is_cpu():
            return "cpu", "vLLM CPU platform"
        if current_platform.is_cuda():
            cap = current_platform.get_device_capability()
            if cap is None:
                return None, "CUDA platform but no device capability"
            name = _safe(current_platform.get_device_name)
            return f"sm{cap.major}{cap.minor}", f"{name} (compute capability {cap.major}.{cap.minor})"
        if current_platform.is_rocm():
            arch = _rocm_arch()
            if arch is None:
                return None, "ROCm platform, gfx architecture unknown"
            return arch, f"ROCm {arch}"
        return None, f"unsupported vLLM platform {type(current_platform).__name__}"
    except Exception as exc:
        return None, f"platform query failed: {exc}"


def _safe(fn) -> str:
    try:
        return str(fn())
    except Exception:
        return "unknown device"


def _rocm_arch() -> str | None:
    """vLLM's ROCm platform caches the arch name it read through amdsmi; the global moved across releases."""
    try:
        from vllm.platforms import rocm
    except Exception:
        return None
    for attr in ("_GCN_ARCH", "GCN_ARCH"):
        arch = getattr(rocm, attr, None)
        if isinstance(arch, str) and arch.startswith("gfx"):
            return arch.split(":")[0]
    return None


def interpreter_off(family: str | None, served_by: str):
    """The startup decline of a Triton op on the CPU without ``TRITON_INTERPRET=1`` (vLLM's CPU build has no
    Triton CPU backend: the kernels run there only in Triton's interpreter, for validation), else None."""
    from infera_vllm.spec import Decline
    from infera_vllm.switches import triton_interpreter

    if family == "cpu" and not triton_interpreter():
        return Decline("triton-interpreter-off", "on the CPU the Triton kernels run only under TRITON_INTERPRET=1 "
                                                 f"(validation); the calls go to {served_by}")
    return None
