"""Skinny-M linear: infera-linear-hipblaslt's Triton kernel vs torch's ``F.linear`` (vLLM's CUDA GEMM), bf16.

Llama-3-8B shapes (qkv 6144x4096, gate-up 28672x4096, down 4096x14336) at decode and
prefill token counts; for each, the best of a small block grid (or the tuning table's choice where the
shape is tuned), all timed from CUDA-graph replays. Beside them the library's other routes that torch
reaches: cuBLASLt instead of cuBLAS (``torch.backends.cuda.preferred_blas_library``) and TunableOp's
per-shape algorithm search (tuned once per shape outside the timing, then replayed; the solution it
picked is recorded), so the table can say whether any BLASLt choice beats the default. Floor =
max(weight bytes / copy bandwidth, FLOPs / 790 TFLOP/s). Prints a table, writes JSON after every row (a
time-out keeps what finished) and a plot under ``results/<gpu>/`` (or ``--out DIR``).

    python benchmarks/bench_linear.py [--tokens 1,16,64,512]
"""

from __future__ import annotations

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import (  # noqa: E402
    Column,
    Panel,
    Series,
    arguments,
    copy_ceiling_tb_s,
    describe_machine,
    figure,
    graph_us,
    results_dir,
    table,
    write_json,
)

SHAPES = ((6144, 4096), (28672, 4096), (4096, 14336))  # (N, K)
GRID = {"block_n": (16, 32, 64), "block_k": (256,), "split_k": (1, 2), "num_stages": (3, 4)}
PEAK_TFLOPS = 790.0  # H200 dense bf16 peak: the matrix-rate floor


def main() -> int:
    import torch.nn.functional as F
    from triton.runtime.errors import OutOfResources

    from infera_ops.linear_hipblaslt import launch, policy
    from infera_ops.linear_hipblaslt.launch import LaunchConfig
    from infera_ops.linear_hipblaslt.reference import linear_reference
    from infera_vllm.platform import detect_gpu_family

    parser = arguments(__doc__)
    parser.add_argument("--tokens", default="1,16,64,512")
    args = parser.parse_args()
    machine = describe_machine()
    ceiling = copy_ceiling_tb_s()
    tuned = policy.load(detect_gpu_family()[0] or "unknown")
    out_dir = args.out or results_dir(machine)
    rows = []
    for (N, K), M in itertools.product(SHAPES, [int(t) for t in args.tokens.split(",")]):
        w = torch.randn(N, K, dtype=torch.bfloat16, device="cuda") / K**0.5
        x = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
        ref = linear_reference(x, w, None)
        t_torch = graph_us([lambda: F.linear(x, w)])
        t_lt, t_tunable, tunable_solution = blaslt_routes(x, w, ref)
        buckets = tuned.buckets(N, K, "bfloat16", False) if tuned else None
        bucket = policy.Table.choose(buckets, M) if buckets else None
        if bucket is not None and bucket.choice == "triton":
            cands, source = [bucket.config], "table"
        else:
            block_m = max(16, min(64, 1 << (M - 1).bit_length()))
            cands = [LaunchConfig(block_m=block_m, **dict(zip(GRID, v))) for v in itertools.product(*GRID.values())]
            source = "grid"
        best, t_best, err = None, float("inf"), None
        for cfg in cands:
            try:
                got = launch.skinny_linear(x, w, None, cfg)
            except OutOfResources:  # e.g. 64-row tiles with 4 stages exceed shared memory: not a candidate
                continue
            e = ((got.float() - ref).abs().max() / ref.abs().max()).item()
            if not e <= 2e-2:
                continue
            t = graph_us([lambda: launch.skinny_linear(x, w, None, cfg)])
            if t < t_best:
                best, t_best, err = cfg, t, e
        floor_us = max(N * K * 2 / (ceiling * 1e12), 2 * M * N * K / (PEAK_TFLOPS * 1e12)) * 1e6
        row = {"N": N, "K": K, "M": M, "torch_us": t_torch, "infera_us": t_best, "speedup": t_torch / t_best,
               "cublaslt_us": t_lt, "tunableop_us": t_tunable, "tunableop_solution": tunable_solution,
               "floor_us": floor_us, "torch_of_floor": floor_us / t_torch, "infera_of_floor": floor_us / t_best,
               "config": best.as_dict() if best else None, "source": source, "max_rel_err": err}
        rows.append(row)
        print(f"N={N:<6} K={K:<6} M={M:<5} F.linear {t_torch:8.1f} us ({row['torch_of_floor']:5.0%} of floor) | "
              f"triton {t_best:8.1f} us ({row['infera_of_floor']:5.0%}) x{row['speedup']:.2f} [{source}] "
              f"{best.as_dict() if best else '-'} | cuBLASLt {t_lt:.1f} us x{t_torch / t_lt:.2f} | "
              f"TunableOp {t_tunable:.1f} us x{t_torch / t_tunable:.2f} ({tunable_solution})", flush=True)
        path = write_json(out_dir, "bench_linear", {"benchmark": "bench_linear", "machine": machine,
                                                    "copy_ceiling_tb_s": ceiling, "peak_tflops": PEAK_TFLOPS,
                                                    "tuning": tuned.source if tuned else None, "rows": rows})
    print_table(rows, ceiling)
    plot(rows, path.replace(".json", ".png"))
    print(f"copy ceiling {ceiling:.2f} TB/s; wrote {path}")
    return 0


def blaslt_routes(x, w, ref) -> tuple[float, float, str]:
    """F.linear timed with cuBLASLt preferred, and with TunableOp on after tuning this shape once (results
    kept in memory only). Returns (cuBLASLt us, TunableOp us, TunableOp's chosen solution); inf for a route
    whose result differs from the reference."""
    import torch.nn.functional as F

    def checked(fn) -> float:
        got = fn()
        if not ((got.float() - ref).abs().max() / ref.abs().max()).item() <= 2e-2:
            return float("inf")
        return graph_us([fn])

    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        t_lt = checked(lambda: F.linear(x, w))
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    tunable = torch.cuda.tunable
    if hasattr(tunable, "write_file_on_exit"):  # not in torch 2.11
        tunable.write_file_on_exit(False)
    tunable.set_filename(os.path.join(os.environ.get("TMPDIR", "/tmp"), "infera_bench_tunableop.csv"))
    tunable.enable(True)
    tunable.tuning_enable(True)
    try:
        known = set(map(tuple, tunable.get_results()))
        F.linear(x, w)  # tunes this (op, shape, dtype) once, eagerly
        torch.cuda.synchronize()
        tunable.tuning_enable(False)
        t_tunable = checked(lambda: F.linear(x, w))
        new = [r for r in map(tuple, tunable.get_results()) if r not in known]
        solution = "; ".join(f"{r[0]} {r[1]}: {r[2]}" for r in new) or "already tuned"
    finally:
        tunable.tuning_enable(False)
        tunable.enable(False)
    return t_lt, t_tunable, solution


def print_table(rows: list, ceiling: float) -> None:
    print()
    print(table(rows, [
        Column("N", "N"), Column("K", "K"), Column("M", "M"), Column("F.linear us", "torch_us", ".1f"),
        Column("triton us", "infera_us", ".1f"), Column("x", "speedup", ".2f"),
        Column("cuBLASLt us", "cublaslt_us", ".1f"), Column("TunableOp us", "tunableop_us", ".1f"),
        Column("floor us", "floor_us", ".1f"),
        Column("F.linear%floor", lambda r: r["torch_of_floor"] * 100, ".0f"),
        Column("triton%floor", lambda r: r["infera_of_floor"] * 100, ".0f"), Column("source", "source", align="<"),
    ], f"copy ceiling {ceiling:.2f} TB/s; floor = max(weight bytes / copy ceiling, FLOPs / {PEAK_TFLOPS:.0f} "
       f"TFLOP/s); x = F.linear us / triton us"))


def plot(rows, path):
    """Per (N, K): µs over M for F.linear (its cuBLAS, cuBLASLt and TunableOp routes) and our kernel, against
    the floor."""
    panels = []
    for N, K in sorted({(r["N"], r["K"]) for r in rows}):
        sel = [r for r in rows if (r["N"], r["K"]) == (N, K)]
        panels.append(Panel(f"N={N} K={K} bf16", [r["M"] for r in sel], "us", xlabel="M (tokens)", logx=True, logy=True,
                            lines=[Series(label, [r[key] for r in sel], style) for key, label, style in (
                                ("torch_us", "F.linear (vLLM's CUDA GEMM)", "o-"),
                                ("infera_us", "infera skinny-M Triton", "o-"),
                                ("cublaslt_us", "F.linear via cuBLASLt", "s:"),
                                ("tunableop_us", "F.linear with TunableOp", "^:"),
                                ("floor_us", "floor (weight bytes / copy BW, FLOPs / peak)", "k--"))]))
    figure(path, [panels])


if __name__ == "__main__":
    raise SystemExit(main())
