"""RMSNorm and fused add+RMSNorm: infera vs vLLM's ``vllm_c`` CUDA kernels vs vLLM's native provider
compiled by torch.compile, side by side on one GPU.

Providers: ``infera`` = what vLLM runs with the op first (the torch custom ops ``infera::*`` of
seam.py, including the fused add's hand-over to vllm_c where that measured faster); ``infera_kernel``
= the Triton kernel alone (no hand-over); ``vllm_c``; ``native_compiled``.

Bytes counted = each input read once + each output written once (rms_norm: 2·M·H·2 B; fused add:
4·M·H·2 B; the weight is negligible). Achieved bandwidth is compared with the device copy ceiling measured
in the same run (a large device-to-device copy, bytes read + written).

Three timings per provider:
- ``graph`` (warm): replayed from a CUDA graph on the same tensors, as vLLM runs decode (the input was just
  written by a GEMM and sits in L2);
- ``cold``: replayed from a CUDA graph cycling over tensor sets 4x the L2 size: every byte from HBM, no
  host cost: the kernel against the copy ceiling;
- ``eager``: triton's do_bench (L2 flushed before each call, host launch included when it is longer than
  the flush). vLLM itself hands eager calls below 4096 tokens to vllm_c (seam.py), so those eager rows
  show the launch cost that rule avoids.

    python benchmarks/bench_norm.py            # on a GPU with vLLM installed; table + JSON + PNG under results/<gpu>/
"""

from __future__ import annotations

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
    results_dir,
    table,
    write_json,
)
from tune_norm import cycle_us, tensor_sets  # noqa: E402

HS = (576, 2048, 4096, 7168, 8192)
MS = (1, 16, 64, 256, 512, 1024, 2048, 4096, 16384)
EPS = 1e-6
NAMES = ("infera", "infera_kernel", "vllm_c", "native_compiled")


def providers():
    """op -> name -> call(x, other, w); ``other`` is the residual (fused add, in place on x and it, as vLLM
    calls every provider) or the output buffer (rms_norm)."""
    from vllm import _custom_ops as vllm_ops
    from vllm.ir.ops import layernorm as native

    from infera_ops.norm import launch as kernel
    from infera_ops.norm import seam

    seam.install("norm", allow_cpu=False)  # registers the custom ops and the fused add's hand-over

    native_rms = torch.compile(lambda x, w: native.rms_norm.impls["native"].impl_fn(x, w, EPS), dynamic=True)
    native_fused = torch.compile(lambda x, r, w: native.fused_add_rms_norm.impls["native"].impl_fn(x, r, w, EPS),
                                 dynamic=True)
    return {
        "rms_norm": {
            "infera": lambda x, y, w: torch.ops.infera.rms_norm(x, w, EPS),
            "infera_kernel": lambda x, y, w: kernel.rms_norm(x, w, EPS, out=y),
            "vllm_c": lambda x, y, w: vllm_ops.rms_norm(y, x, w, EPS),
            "native_compiled": lambda x, y, w: native_rms(x, w),
        },
        "fused_add_rms_norm": {
            "infera": lambda x, r, w: torch.ops.infera.fused_add_rms_norm_(x, r, w, EPS),
            "infera_kernel": lambda x, r, w: kernel.fused_add_rms_norm(x, r, w, EPS, out=x, residual_out=r),
            "vllm_c": lambda x, r, w: vllm_ops.fused_add_rms_norm(x, r, w, EPS),
            "native_compiled": lambda x, r, w: native_fused(x, r, w),
        },
    }


def main() -> int:
    from triton.testing import do_bench

    parser = arguments(__doc__)
    parser.add_argument("--ops", default="", help="comma-separated IR ops to time (default: all)")
    args = parser.parse_args()
    machine = describe_machine()
    ceiling = copy_ceiling_tb_s()
    rows = []
    only = [o for o in args.ops.split(",") if o]
    for op, impls in providers().items():
        if only and op not in only:
            continue
        tensors_moved = 2 if op == "rms_norm" else 4
        for H in HS:
            for M in MS:
                sets = {mode: tensor_sets(op, M, H, mode == "cold") for mode in ("warm", "cold")}
                nbytes = tensors_moved * M * H * 2
                row = {"op": op, "H": H, "M": M, "bytes": nbytes}
                for name, fn in impls.items():
                    x, other, w = sets["warm"][0]
                    ms = do_bench(lambda: fn(x, other, w), return_mode="median")
                    row[f"{name}_us"] = ms * 1e3
                    row[f"{name}_graph_us"] = cycle_us(fn, sets["warm"])
                    row[f"{name}_cold_us"] = cycle_us(fn, sets["cold"])
                    row[f"{name}_cold_pct_copy"] = nbytes / (row[f"{name}_cold_us"] * 1e-6) / 1e12 / ceiling * 100
                for mode in ("", "_graph", "_cold"):
                    row[f"speedup{mode}_vs_vllm_c"] = row[f"vllm_c{mode}_us"] / row[f"infera{mode}_us"]
                rows.append(row)
                print(f"{op:<19} H={H:<5} M={M:<6} graph: infera {row['infera_graph_us']:7.2f} vllm_c "
                      f"{row['vllm_c_graph_us']:7.2f} compiled {row['native_compiled_graph_us']:7.2f} "
                      f"x{row['speedup_graph_vs_vllm_c']:.2f}"
                      f" | cold: infera {row['infera_cold_us']:7.2f} vllm_c {row['vllm_c_cold_us']:7.2f} "
                      f"x{row['speedup_cold_vs_vllm_c']:.2f} ({row['infera_cold_pct_copy']:4.1f}% vs "
                      f"{row['vllm_c_cold_pct_copy']:4.1f}% of copy)"
                      f" | eager: infera {row['infera_us']:6.1f} kernel {row['infera_kernel_us']:6.1f} "
                      f"vllm_c {row['vllm_c_us']:6.1f} "
                      f"x{row['speedup_vs_vllm_c']:.2f}", flush=True)
                del sets
    out_dir = args.out or results_dir(machine)
    path = write_json(out_dir, "bench_norm", {"benchmark": "bench_norm", "machine": machine,
                                              "copy_ceiling_tb_s": ceiling, "rows": rows})
    print_table(rows, ceiling)
    plot(rows, ceiling, path.replace(".json", ".png"))
    print(f"copy ceiling {ceiling:.2f} TB/s; wrote {path}")
    return 0


def print_table(rows: list, ceiling: float) -> None:
    print()
    columns = [Column("op", "op", align="<"), Column("H", "H"), Column("M", "M")]
    for mode, what in (("cold", "cold"), ("graph", "warm")):
        columns += [Column(f"{n} {what} us", f"{n}_{mode}_us", ".2f") for n in ("infera", "vllm_c", "native_compiled")]
        columns.append(Column(f"x {what}", f"speedup_{mode}_vs_vllm_c", ".2f"))
    columns += [Column("infera%copy", "infera_cold_pct_copy", ".1f"),
                Column("vllm_c%copy", "vllm_c_cold_pct_copy", ".1f"), Column("x eager", "speedup_vs_vllm_c", ".2f")]
    print(table(rows, columns, f"copy ceiling {ceiling:.2f} TB/s; cold = CUDA-graph replays from HBM, warm = the "
                               f"same tensors (L2); x = vllm_c us / infera us"))


def plot(rows, ceiling, path):
    """Achieved bandwidth from HBM (cold graph replays) vs M, per op and hidden size, with the copy ceiling;
    the warm (L2) figures dotted, for the decode picture."""
    grid = []
    for op in sorted({r["op"] for r in rows}, reverse=True):
        panels = []
        for H in HS:
            sel = [r for r in rows if r["op"] == op and r["H"] == H]
            if not sel:
                continue

            def tbs(key, sel=sel):
                return [r["bytes"] / (r[key] * 1e-6) / 1e12 for r in sel]

            panels.append(Panel(f"{op} H={H}", [r["M"] for r in sel], "achieved TB/s (CUDA graph replay)",
                                xlabel="M (tokens)", logx=True, ceiling=(ceiling, f"copy ceiling {ceiling:.2f} TB/s"),
                                lines=[Series(f"{n} (HBM)", tbs(f"{n}_cold_us"), style)
                                       for n, style in (("infera", "o-"), ("vllm_c", "s-"), ("native_compiled", "^-"))]
                                + [Series(f"{n} (L2 warm)", tbs(f"{n}_graph_us"), style, alpha=0.5)
                                   for n, style in (("infera", "o:"), ("vllm_c", "s:"))]))
        grid.append(panels)
    figure(path, grid)


if __name__ == "__main__":
    raise SystemExit(main())
