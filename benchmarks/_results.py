"""What every benchmark records beside its numbers: the machine, the software versions and the commit."""

from __future__ import annotations

import json
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


def _commit() -> str | None:
    if os.environ.get("INFERA_COMMIT"):  # the GPU machine gets a copy of the tree without .git
        return os.environ["INFERA_COMMIT"]
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return None


def describe_machine() -> dict:
    gpu = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = torch.cuda.get_device_name()
    except Exception:
        pass
    return {"gpu": gpu, "vllm": _version("vllm"), "torch": _version("torch"), "triton": _version("triton"),
            "infera_vllm": _version("infera_vllm"), "commit": _commit()}


def results_dir(machine: dict) -> str:
    """``benchmarks/results/<gpu>/``: ``h200`` for 'NVIDIA H200', ``cpu`` without a GPU."""
    name = machine["gpu"].lower().replace("nvidia", "").strip()
    short = re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "cpu"
    return os.path.join(HERE, "results", short)


def write_json(directory: str, name: str, doc: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{name}.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    return path


def copy_ceiling_tb_s(gib: int = 2) -> float:
    """The GPU's copy bandwidth (read + write bytes per second) over ``gib`` GiB, far beyond any L2."""
    import torch
    from triton.testing import do_bench

    src = torch.empty(gib * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda dst=dst, src=src: dst.copy_(src), return_mode="median")
    nbytes = 2 * src.numel() * 2
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / (ms * 1e-3) / 1e12


def read_ceiling_tb_s(gib: int = 4) -> float:
    """The GPU's read bandwidth: a streaming sum over ``gib`` GiB (a grid-stride Triton kernel, one fp32
    partial per program), the best of it and torch's own sum. Read-only traffic runs faster than a copy:
    weight-streaming kernels are judged against this."""
    import torch
    import triton
    import triton.language as tl
    from triton.testing import do_bench

    @triton.jit
    def _stream_sum(x_ptr, part_ptr, n, BLOCK: tl.constexpr):
        pid, programs = tl.program_id(0), tl.num_programs(0)
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for start in range(pid * BLOCK, n, programs * BLOCK):
            idx = start + tl.arange(0, BLOCK)
            acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
        tl.store(part_ptr + pid, tl.sum(acc, axis=0))

    x = torch.empty(gib * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    best = float("inf")
    for programs, block, warps in ((sms * 4, 4096, 8), (sms * 8, 2048, 4), (sms * 2, 8192, 16), (sms * 4, 16384, 16),
                                   (sms * 16, 4096, 4)):
        part = torch.empty(programs, dtype=torch.float32, device="cuda")
        best = min(best, do_bench(lambda x=x: _stream_sum[(programs,)](x, part, x.numel(), BLOCK=block,
                                                                       num_warps=warps), return_mode="median"))
    best = min(best, do_bench(lambda x=x: x.sum(dtype=torch.float32), return_mode="median"))
    nbytes = x.numel() * 2
    del x
    torch.cuda.empty_cache()
    return nbytes / (best * 1e-3) / 1e12
