"""RMSNorm and fused add+RMSNorm: infera's Triton kernels vs vLLM's ``vllm_c`` CUDA kernels vs vLLM's
native provider compiled by torch.compile, side by side on one GPU.

Bytes counted = each input read once + each output written once (rms_norm: 2·M·H·2 B; fused add:
4·M·H·2 B; the weight is negligible). Achieved bandwidth is compared with the device copy ceiling measured
in the same run (a large device-to-device copy, bytes read + written).

Two timings per provider: ``eager`` = do_bench median, L2 flushed between repeats, host launch cost
included (what an eager vLLM sees); ``graph`` = do_bench_cudagraph, the call replayed from a CUDA graph,
as vLLM runs decode and piecewise-compiled models (no launch cost; inputs may sit in L2 as they do after
the GEMM that wrote them).

    python benchmarks/bench_norm.py            # on a GPU with vLLM installed; table + JSON + PNG under results/<gpu>/
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import describe_machine, results_dir, write_json  # noqa: E402

HS = (576, 2048, 4096, 7168, 8192)
MS = (1, 16, 64, 256, 1024, 4096, 16384)
EPS = 1e-6


def copy_ceiling_tb_s() -> float:
    from triton.testing import do_bench

    src = torch.empty(2 * 1024**3 // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def providers():
    # vllm_c's fused add is in place, as vLLM calls it; ours is called in place too (the IR provider's
    # contract), so both work on two tensors of footprint.
    from vllm import _custom_ops as vllm_ops
    from vllm.ir.ops import layernorm as native

    from infera_ops.norm import ops as infera

    def vllm_rms(x, r, w):
        out = torch.empty_like(x)
        vllm_ops.rms_norm(out, x, w, EPS)
        return out

    def vllm_fused(x, r, w):
        vllm_ops.fused_add_rms_norm(x, r, w, EPS)  # in place, as vLLM calls it
        return x, r

    native_rms = torch.compile(lambda x, r, w: native.rms_norm.impls["native"].impl_fn(x, w, EPS), dynamic=True)
    native_fused = torch.compile(lambda x, r, w: native.fused_add_rms_norm.impls["native"].impl_fn(x, r, w, EPS),
                                 dynamic=True)
    return {
        "rms_norm": {"infera": lambda x, r, w: infera.rms_norm(x, w, EPS), "vllm_c": vllm_rms, "native_compiled": native_rms},
        "fused_add_rms_norm": {"infera": lambda x, r, w: infera.fused_add_rms_norm(x, r, w, EPS, out=x, residual_out=r),
                               "vllm_c": vllm_fused,
                               "native_compiled": native_fused},
    }


def main() -> int:
    from triton.testing import do_bench, do_bench_cudagraph

    machine = describe_machine()
    ceiling = copy_ceiling_tb_s()
    rows = []
    only = [o for o in os.environ.get("BENCH_OPS", "").split(",") if o]  # e.g. BENCH_OPS=fused_add_rms_norm
    for op, impls in providers().items():
        if only and op not in only:
            continue
        tensors_moved = 2 if op == "rms_norm" else 4
        for H in HS:
            for M in MS:
                x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
                r = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
                w = torch.randn(H, dtype=torch.bfloat16, device="cuda")
                nbytes = tensors_moved * M * H * 2
                row = {"op": op, "H": H, "M": M, "bytes": nbytes}
                for name, fn in impls.items():
                    ms = do_bench(lambda: fn(x, r, w), return_mode="median")
                    row[f"{name}_us"] = ms * 1e3
                    row[f"{name}_pct_copy"] = nbytes / (ms * 1e-3) / 1e12 / ceiling * 100
                    gms = do_bench_cudagraph(lambda: fn(x, r, w), rep=20, return_mode="median")
                    row[f"{name}_graph_us"] = gms * 1e3
                row["speedup_vs_vllm_c"] = row["vllm_c_us"] / row["infera_us"]
                row["graph_speedup_vs_vllm_c"] = row["vllm_c_graph_us"] / row["infera_graph_us"]
                rows.append(row)
                print(f"{op:<19} H={H:<5} M={M:<6} eager: infera {row['infera_us']:7.1f} vllm_c {row['vllm_c_us']:7.1f} "
                      f"compiled {row['native_compiled_us']:7.1f} us x{row['speedup_vs_vllm_c']:.2f} ({row['infera_pct_copy']:4.1f}% vs "
                      f"{row['vllm_c_pct_copy']:4.1f}%) | graph: infera {row['infera_graph_us']:7.2f} vllm_c "
                      f"{row['vllm_c_graph_us']:7.2f} compiled {row['native_compiled_graph_us']:7.2f} us "
                      f"x{row['graph_speedup_vs_vllm_c']:.2f}", flush=True)
    out_dir = os.environ.get("BENCH_OUT") or results_dir(machine)
    path = write_json(out_dir, "bench_norm", {"benchmark": "bench_norm", "machine": machine,
                                              "copy_ceiling_tb_s": ceiling, "rows": rows})
    plot(rows, ceiling, path.replace(".json", ".png"))
    print(f"copy ceiling {ceiling:.2f} TB/s; wrote {path}")
    return 0


def plot(rows, ceiling, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops_run = sorted({r["op"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(len(ops_run), len(HS), figsize=(4 * len(HS), 3.5 * len(ops_run)), sharey=True, squeeze=False)
    for i, op in enumerate(ops_run):
        for j, H in enumerate(HS):
            ax = axes[i][j]
            sel = [r for r in rows if r["op"] == op and r["H"] == H]
            for name in ("infera", "vllm_c", "native_compiled"):
                ax.plot([r["M"] for r in sel], [r["bytes"] / (r[f"{name}_us"] * 1e-6) / 1e12 for r in sel], "o-", label=name)
            ax.axhline(ceiling, color="k", ls="--", label=f"copy ceiling {ceiling:.2f} TB/s")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op} H={H}", fontsize=9)
            ax.set_xlabel("M (tokens)")
            if j == 0:
                ax.set_ylabel("achieved TB/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
