"""Decode MoE experts: infera's kernels vs vLLM's ``fused_experts`` (Triton), bf16, random routing, one GPU.

Bytes = distinct experts read x 3·I·H·2 (the weight traffic; activations are negligible at decode).
Timed from CUDA-graph replays (``do_bench_cudagraph``), as vLLM runs decode; copy ceiling measured in the
same run. Blocks from the family's tuning (``tuning/<family>.json`` or ``INFERA_MOE_DECODE_TUNING``), else the
defaults; ``served`` says whether the op would take that M (above ``max_tokens`` it hands over to vLLM, so
the production ratio there is 1.0 by construction). Prints a table, writes JSON + a plot under ``results/<gpu>/`` (or ``$BENCH_OUT``).

    python benchmarks/bench_moe_decode.py
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import describe_machine, results_dir, write_json  # noqa: E402

DIMS = {  # name: (E, H, I, top-k)
    "qwen3-30b-a3b": (128, 2048, 768, 8),
    "deepseek-v3": (256, 7168, 2048, 8),
    "mixtral": (8, 4096, 14336, 2),
}
MS = (1, 2, 4, 8, 16, 32, 64)


def copy_ceiling_tb_s() -> float:
    from triton.testing import do_bench

    src = torch.empty(1024**3, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * 2 / (ms * 1e-3) / 1e12


def main() -> int:
    from triton.testing import do_bench_cudagraph
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

    from infera_ops.moe_decode import ops, tuning
    from infera_ops.moe_decode.kernels import LaunchConfig
    from infera_ops.moe_decode.reference import moe_experts_reference
    from infera_vllm.platform import detect_gpu_family

    machine = describe_machine()
    tuned = tuning.load(detect_gpu_family()[0])
    print(f"blocks: {tuned.source if tuned else 'defaults (no tuning file)'}; "
          f"serves up to {tuned.max_tokens if tuned else '-'} tokens", flush=True)
    ceiling = copy_ceiling_tb_s()
    rows = []
    torch.manual_seed(0)
    for name, (E, H, I, K) in DIMS.items():
        w13 = torch.randn(E, 2 * I, H, dtype=torch.bfloat16, device="cuda") / H**0.5
        w2 = torch.randn(E, H, I, dtype=torch.bfloat16, device="cuda") / I**0.5
        for M in MS:
            x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda")
            weights, ids = torch.randn(M, E, device="cuda").softmax(-1).topk(K)
            ids = ids.to(torch.int32)
            distinct = int(torch.unique(ids).numel())
            nbytes = distinct * 3 * I * H * 2
            cfg = tuned.config_for(M) if tuned else LaunchConfig()
            ours = ops.moe_experts(x, w13, w2, weights, ids, config=cfg)
            theirs = fused_experts(x, w13, w2, weights, ids)
            err = ((ours.float() - theirs.float()).abs().max() / theirs.float().abs().max()).item()
            if M <= 4:
                ref = moe_experts_reference(x, w13, w2, weights, ids)
                err = max(err, ((ours.float() - ref).abs().max() / ref.abs().max()).item())
            t_ours = do_bench_cudagraph(lambda: ops.moe_experts(x, w13, w2, weights, ids, config=cfg), rep=30) * 1e3
            t_vllm = do_bench_cudagraph(lambda: fused_experts(x, w13, w2, weights, ids), rep=30) * 1e3
            row = {"dims": name, "E": E, "H": H, "I": I, "topk": K, "M": M, "distinct_experts": distinct,
                   "bytes": nbytes, "infera_us": t_ours, "vllm_us": t_vllm, "speedup": t_vllm / t_ours,
                   "infera_pct_copy": nbytes / (t_ours * 1e-6) / 1e12 / ceiling * 100,
                   "vllm_pct_copy": nbytes / (t_vllm * 1e-6) / 1e12 / ceiling * 100, "max_rel_err": err,
                   "served": bool(tuned and M <= tuned.max_tokens), "config": cfg.as_dict()}
            rows.append(row)
            print(f"{name:<14} M={M:<3} experts={distinct:<4} infera {t_ours:8.1f} us ({row['infera_pct_copy']:5.1f}%) "
                  f"vllm {t_vllm:8.1f} us ({row['vllm_pct_copy']:5.1f}%) x{row['speedup']:.2f} rel.err {err:.1e}"
                  f"{'' if row['served'] else ' (handed over in serving)'}",
                  flush=True)
    out_dir = os.environ.get("BENCH_OUT") or results_dir(machine)
    path = write_json(out_dir, "bench_moe_decode", {"benchmark": "bench_moe_decode", "machine": machine,
                                                    "copy_ceiling_tb_s": ceiling,
                                                    "tuning": tuned.source if tuned else None, "rows": rows})
    plot(rows, ceiling, path.replace(".json", ".png"))
    print(f"copy ceiling {ceiling:.2f} TB/s; wrote {path}")
    return 0


def plot(rows, ceiling, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DIMS), figsize=(5 * len(DIMS), 3.8), squeeze=False)
    for ax, name in zip(axes[0], DIMS):
        sel = [r for r in rows if r["dims"] == name]
        for key, label in (("infera_us", "infera"), ("vllm_us", "vLLM fused_experts")):
            ax.plot([r["M"] for r in sel], [r["bytes"] / (r[key] * 1e-6) / 1e12 for r in sel], "o-", label=label)
        ax.axhline(ceiling, color="k", ls="--", label=f"copy ceiling {ceiling:.2f} TB/s")
        ax.set_xscale("log", base=2)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("weight bytes / time (TB/s)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    raise SystemExit(main())
