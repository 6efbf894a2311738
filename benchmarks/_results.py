"""What every benchmark shares: its command line's common part (``--out``), what it records beside its numbers
(the machine, the software versions and the commit), the copy and read ceilings and the traffic floor it is
measured against, and its kernels' GPU times."""

from __future__ import annotations

import argparse
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


def arguments(doc: str) -> argparse.ArgumentParser:
    """The command line every benchmark and tuner starts from (``--out``); each adds its own options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results/<gpu>/)")
    return parser


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


# ---- the traffic floor of one call: its bytes read with nothing else to do -----------------------------------

# (programs per SM, BLOCK, warps, stages) tried for the floor; the best counts
STREAM_LAUNCHES = ((4, 4096, 8, 3), (8, 2048, 4, 3), (2, 8192, 16, 2), (16, 1024, 4, 3))
_STREAM: dict = {}


def _stream_regions_kernel():
    """The region-streaming kernel, defined once (Triton compiles each new function object again)."""
    if "kernel" not in _STREAM:
        import triton
        import triton.language as tl

        @triton.jit
        def _stream_regions(a_ptr, a_ids_ptr, a_n, a_per, b_ptr, b_ids_ptr, b_n, b_per, part_ptr,
                            BLOCK: tl.constexpr):
            """part[pid] = the fp32 sum of this program's chunks of two lists of regions:

                a's regions a_ids[0..a_n), each a_per contiguous elements at a_ptr + a_ids[r]·a_per,
                then b's likewise (b_n = 0: none; b_ptr and b_ids_ptr are then not read).

            Chunks of BLOCK elements, region by region, grid-stride over the programs; the sum only keeps
            the loads live. ``BLOCK``: elements per load (a multiple of the vector width)."""
            pid, programs = tl.program_id(0), tl.num_programs(0)
            acc = tl.zeros((BLOCK,), dtype=tl.float32)
            a_chunks = tl.cdiv(a_per, BLOCK)
            for c in range(pid, a_n * a_chunks, programs):
                off = (c % a_chunks) * BLOCK + tl.arange(0, BLOCK)
                base = tl.load(a_ids_ptr + c // a_chunks).to(tl.int64) * a_per
                acc += tl.load(a_ptr + base + off, mask=off < a_per, other=0.0).to(tl.float32)
            b_chunks = tl.cdiv(b_per, BLOCK)
            for c in range(pid, b_n * b_chunks, programs):
                off = (c % b_chunks) * BLOCK + tl.arange(0, BLOCK)
                base = tl.load(b_ids_ptr + c // b_chunks).to(tl.int64) * b_per
                acc += tl.load(b_ptr + base + off, mask=off < b_per, other=0.0).to(tl.float32)
            tl.store(part_ptr + pid, tl.sum(acc, axis=0))

        _STREAM["kernel"] = _stream_regions
    return _STREAM["kernel"]


def stream_regions(launch: list, programs: int, block: int, warps: int = 4, stages: int = 3):
    """One launch reading the regions of ``launch`` = [(tensor, ids, per), ...] (one or two segments: the
    regions ``ids`` of ``per`` contiguous elements of the flat ``tensor``); returns the per-program fp32
    partial sums (their total is the sum of every element read)."""
    import torch

    a, a_ids, a_per = launch[0]
    b, b_ids, b_per = launch[1] if len(launch) > 1 else (a, a_ids, 0)  # no second segment: none of it read
    part = torch.empty(programs, dtype=torch.float32, device=a.device)
    _stream_regions_kernel()[(programs,)](a, a_ids, a_ids.numel(), a_per, b, b_ids, b_ids.numel(), b_per, part,
                                          BLOCK=block, num_warps=warps, num_stages=stages)
    return part


def stream_floor_us(calls: list, rep_ms: int = 20) -> float:
    """The traffic floor of a call that reads given regions in given launches: ``calls`` = one entry per
    call, each a list of launches (a launch: [(tensor, ids, per), ...], at most two segments), replayed back
    to back in one CUDA graph as the benchmark replays the kernel under test (its calls over different
    regions, so L2 starts cold); µs per call, the best of STREAM_LAUNCHES for the whole replay. The same bytes
    in the same number of dependent launches as the kernel: what that kernel's time can approach, fixed
    costs of a launch included."""
    import torch
    from triton.testing import do_bench_cudagraph

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    best = float("inf")
    for per_sm, block, warps, stages in STREAM_LAUNCHES:
        def replay(per_sm=per_sm, block=block, warps=warps, stages=stages):
            for launches in calls:
                for launch in launches:
                    stream_regions(launch, sms * per_sm, block, warps, stages)

        best = min(best, do_bench_cudagraph(replay, rep=rep_ms) * 1e3 / len(calls))
    return best


def kernel_times_us(fn, calls: int = 1, reps: int = 10) -> dict | None:
    """The GPU time of each kernel ``fn`` launches, per call: ``fn`` (which makes ``calls`` calls, e.g. one
    per cold-L2 rotation) run ``reps`` times eagerly under torch.profiler's CUDA activity, each kernel's total
    duration / (reps x calls), by kernel name. Kernel durations only: the gaps between launches are not in
    them (a graph replay's time is). None where the profiler records no CUDA kernels or cannot run (no GPU,
    no CUPTI): a benchmark's other numbers do not depend on it."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()  # compiled and warm before the trace
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
    except (RuntimeError, AssertionError) as exc:
        print(f"kernel times not taken: the profiler failed ({exc})", flush=True)
        return None
    totals: dict = {}
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time_total > 0:
            totals[event.name] = totals.get(event.name, 0.0) + event.device_time_total
    return {name: us / (reps * calls) for name, us in totals.items()} or None
