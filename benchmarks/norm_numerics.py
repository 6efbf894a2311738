"""How often two RMSNorm providers give bit-identical bf16 outputs, on the GPU: infera's kernel, vLLM's
native provider eager and compiled by torch.compile (Inductor), and vllm_c. Explains end-to-end
agreement figures (docs/operators/norm.md): providers differ in where they round to bf16.

    python benchmarks/norm_numerics.py        # JSON + table under results/<gpu>/ (or --out DIR)
"""

from __future__ import annotations

import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _results import arguments, describe_machine, results_dir, write_json  # noqa: E402

EPS = 1e-6
SHAPES = [(576, 64), (576, 1024), (4096, 64), (4096, 1024)]  # (H, M)


def main() -> int:
    args = arguments(__doc__).parse_args()
    from vllm import _custom_ops as vllm_ops
    from vllm.ir.ops import layernorm as native

    from infera_ops.norm import launch

    native_rms = native.rms_norm.impls["native"].impl_fn
    native_fused = native.fused_add_rms_norm.impls["native"].impl_fn
    compiled_rms = torch.compile(native_rms, dynamic=True)
    compiled_fused = torch.compile(native_fused, dynamic=True)

    def vllm_rms(x, w):
        y = torch.empty_like(x)
        vllm_ops.rms_norm(y, x, w, EPS)
        return y

    def vllm_fused(x, r, w):
        x, r = x.clone(), r.clone()
        vllm_ops.fused_add_rms_norm(x, r, w, EPS)
        return x, r

    rows = []
    torch.manual_seed(0)
    for H, M in SHAPES:
        x = torch.randn(M, H, dtype=torch.bfloat16, device="cuda") * 2
        r = torch.randn_like(x)
        w = (torch.randn(H, device="cuda") * 0.3 + 1).to(torch.bfloat16)
        outs = {
            "rms_norm": {"infera": launch.rms_norm(x, w, EPS), "native": native_rms(x, w, EPS),
                         "native_compiled": compiled_rms(x, w, EPS), "vllm_c": vllm_rms(x, w)},
            "fused_add_rms_norm": {
                "infera": launch.fused_add_rms_norm(x, r, w, EPS), "native": native_fused(x, r, w, EPS),
                "native_compiled": compiled_fused(x, r, w, EPS), "vllm_c": vllm_fused(x, r, w)},
        }
        for op, by in outs.items():
            for a, b in itertools.combinations(by, 2):
                ya, yb = (by[a][0], by[b][0]) if op != "rms_norm" else (by[a], by[b])
                row = {"op": op, "H": H, "M": M, "a": a, "b": b,
                       "identical": (ya == yb).float().mean().item(),
                       "max_abs": (ya.float() - yb.float()).abs().max().item()}
                if op != "rms_norm":
                    row["residual_identical"] = (by[a][1] == by[b][1]).float().mean().item()
                rows.append(row)
                print(f"{op:<19} H={H:<5} M={M:<5} {a:>15} vs {b:<15} identical {row['identical']:.4f} "
                      f"max|diff| {row['max_abs']:.4f}" + (f" residual identical {row['residual_identical']:.4f}"
                                                          if "residual_identical" in row else ""), flush=True)
    machine = describe_machine()
    path = write_json(args.out or results_dir(machine), "norm_numerics",
                      {"benchmark": "norm_numerics", "machine": machine, "rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
