"""What every benchmark shares: its command line's common part (``--out``), what it records beside its numbers
(the machine, the software versions and the commit), the copy and read ceilings and the traffic floor it is
measured against, the timing of its calls from CUDA-graph replays and its kernels' GPU times, and its printed
table and plot."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
L2_BYTES = 50 * 2**20  # H100/H200: a cold-L2 timing cycles over at least 4x this in inputs


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
    regions, so L2 starts cold); µs per call (:func:`graph_us`), the best of STREAM_LAUNCHES. The same bytes
    in the same number of dependent launches as the kernel: what that kernel's time can approach, fixed
    costs of a launch included."""
    import torch

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    best = float("inf")
    for per_sm, block, warps, stages in STREAM_LAUNCHES:
        def call(launches, per_sm=per_sm, block=block, warps=warps, stages=stages):
            for launch in launches:
                stream_regions(launch, sms * per_sm, block, warps, stages)

        best = min(best, graph_us([lambda launches=launches: call(launches) for launches in calls], rep_ms))
    return best


# ---- timing -----------------------------------------------------------------------------------------------

def graph_us(calls: list, rep_ms: float = 30) -> float:
    """µs per call, as vLLM runs decode: ``calls`` (zero-argument callables run in this order, e.g. one per KV
    copy or weight rotation, so that each reads memory the one before did not and L2 starts cold; one callable
    for a warm L2) captured in a CUDA graph as many times over as fill ``rep_ms`` and replayed
    (``triton.testing.do_bench_cudagraph``: a warm-up call on a side stream first, so compilation and
    autotuning stay outside the capture); the median over replays / len(calls). Gaps between launches inside
    the graph are in the figure, the host's launch path is not."""
    from triton.testing import do_bench_cudagraph

    calls = list(calls)

    def replay():
        for call in calls:
            call()

    return do_bench_cudagraph(replay, rep=rep_ms, return_mode="median") * 1e3 / len(calls)


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


# ---- the printed table --------------------------------------------------------------------------------------

def fmt(value, spec: str = "", none: str = "-") -> str:
    """``value`` formatted by ``spec``; ``none`` for a missing value (a run that failed or was not made)."""
    return none if value is None else format(value, spec)


def ratio(a, b):
    """a / b, or None where either is missing (or b is 0)."""
    return None if a is None or b is None or b == 0 else a / b


@dataclass(frozen=True)
class Column:
    """One column of a printed table: its ``header``, the row's value (a key of the row dict, or a function of
    the row), that value's format spec (:func:`fmt`; a missing value prints "-") and alignment (``<`` for
    names)."""

    header: str
    value: str | Callable[[dict], object]
    spec: str = ""
    align: str = ">"

    def cell(self, row: dict) -> str:
        value = self.value(row) if callable(self.value) else row.get(self.value)
        return fmt(value, self.spec)


def table(rows: list, columns: list, legend: str = "") -> str:
    """``rows`` as a fixed-width text table under ``legend`` (what the columns mean): each column as wide as
    its widest cell."""
    cells = [[c.cell(r) for c in columns] for r in rows]
    widths = [max([len(c.header)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]

    def line(values):
        return " ".join(format(v, f"{c.align}{w}") for v, c, w in zip(values, columns, widths)).rstrip()

    header = line([c.header for c in columns])
    return "\n".join(([legend] if legend else []) + [header, "-" * len(header)] + [line(v) for v in cells])


# ---- the plot -----------------------------------------------------------------------------------------------

@dataclass
class Series:
    """One implementation's (or one floor's) values over a panel's x, None where it has none; ``bad``: where the
    result was wrong or the call failed (marked BAD on the plot); ``style``: the matplotlib format of a line."""

    label: str
    values: list
    style: str = "o-"
    bad: list | None = None
    alpha: float = 1.0


@dataclass
class Panel:
    """One subplot: ``x`` numbers (lines) or category labels (grouped bars for ``bars``), ``lines`` drawn over
    them (a floor, a ceiling per x), ``ceiling`` a horizontal line (value, label)."""

    title: str
    x: list
    ylabel: str
    bars: list = field(default_factory=list)
    lines: list = field(default_factory=list)
    ceiling: tuple | None = None
    xlabel: str = ""
    logx: bool = False
    logy: bool = False
    ylim: tuple | None = None


def figure(path: str, grid: list, title: str = "") -> None:
    """A PNG of ``grid`` (rows of :class:`Panel`): ours, vLLM's and the physical ceiling or floor side by side;
    a legend on each row's first panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, cols = len(grid), max(len(r) for r in grid)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.7 * rows), squeeze=False)
    for i, panels in enumerate(grid):
        for j in range(cols):
            if j >= len(panels):
                axes[i][j].axis("off")
                continue
            _draw(axes[i][j], panels[j])
        axes[i][0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _draw(ax, p: Panel) -> None:
    nan = float("nan")
    xs = list(range(len(p.x))) if p.bars else p.x
    width = 0.8 / max(1, len(p.bars))
    for j, s in enumerate(p.bars):
        off = [x + (j - (len(p.bars) - 1) / 2) * width for x in xs]
        ys = [nan if v is None else v for v in s.values]
        ax.bar(off, ys, width, label=s.label, color=f"C{j}", alpha=s.alpha)
        for x, y, bad in zip(off, ys, s.bad or []):
            if bad:  # a wrong or failed result is marked where its bar is (or would be)
                ax.annotate("BAD", (x, y if math.isfinite(y) else 1.0), ha="center", va="bottom", color="red",
                            fontsize=7, rotation=90)
    for s in p.lines:
        marker = {"marker": "_", "markersize": 14} if p.bars else {}
        ax.plot(xs, [nan if v is None else v for v in s.values], s.style, label=s.label, alpha=s.alpha, **marker)
    if p.ceiling:
        ax.axhline(p.ceiling[0], color="k", ls="--", label=p.ceiling[1])
    if p.bars:
        ax.set_xticks(xs)
        ax.set_xticklabels(p.x, fontsize=7)
        ax.set_xlim(-0.6, len(xs) - 0.4)
    if p.logx:
        ax.set_xscale("log", base=2)
    if p.logy:
        ax.set_yscale("log")
    if p.ylim:
        ax.set_ylim(*p.ylim)
    ax.set_title(p.title, fontsize=9)
    ax.set_xlabel(p.xlabel)
    ax.set_ylabel(p.ylabel)
