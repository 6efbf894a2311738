"""Kernel-only probe on the GPU (no vLLM): read ceiling, then forms/configs of the MoE decode kernels."""
import json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch, triton
from _results import copy_ceiling_tb_s, read_ceiling_tb_s
from bench_moe_decode import DIMS, Case, make_weights, rel_err
from infera_ops.moe_decode import ops
from infera_ops.moe_decode.kernels import LaunchConfig, _moe_fused_kernel, block_m, block_mk
from infera_ops.moe_decode.reference import moe_experts_reference

t0 = time.time()
copy, read = copy_ceiling_tb_s(), read_ceiling_tb_s()
print(f"copy {copy:.2f} TB/s read {read:.2f} TB/s", flush=True)
res = {"copy": copy, "read": read, "rows": []}
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
F = dict(form="fused", block_h=128, block_n=64, num_warps=4)
S = dict(form="split", block_h=128, block_n=64, block_k=128, num_warps=4)
G = dict(form="gemv", block_i=16, block_h=256, block_n=16, block_k=256, num_warps=4, num_stages=3)
CANDS = {
    "old-split-64": dict(S, block_i=64, num_stages=4),
    "split-32-mp264": dict(S, block_i=32, num_stages=3, min_programs=264),
    "fused-64-n128": dict(F, block_i=64, num_stages=3, block_n=128),
    "gemv": dict(G),
    "gemv-pdl": dict(G, pdl=True),
    "gemv-h512-k512": dict(G, block_h=512, block_k=512),
    "gemv-i32-w8": dict(G, block_i=32, num_warps=8),
    "gemv-n8-k512": dict(G, block_n=8, block_k=512),
    "gemv-n32-w8": dict(G, block_n=32, num_warps=8),
    "gemv-w2": dict(G, num_warps=2),
    "gemv-i64-mp528": dict(G, block_i=64, min_programs=528),
    "gemv-h128-k128": dict(G, block_h=128, block_k=128),
}
PLAN = [("qwen3-30b-a3b", (1, 2, 4, 8)), ("deepseek-v2-lite", (1, 2)), ("phi-3.5-moe", (1, 2)), ("mixtral", (1, 2)),
        ("deepseek-v3", (1, 2))]
for name, Ms in PLAN:
    w = make_weights(name)
    for M in Ms:
        case = Case(w, name, M, gen)
        ref = moe_experts_reference(case.x[0], case.w13, case.w2, *case.routing[0]) if M <= 2 else None
        line = {}
        for label, params in CANDS.items():
            cfg = LaunchConfig(**params)
            fn = lambda x, w13, w2, wt, ids, cfg=cfg: ops.moe_experts(x, w13, w2, wt, ids, config=cfg)
            try:
                err = rel_err(case.run(fn), ref) if ref is not None else 0.0
                us = case.time_us(fn)
            except Exception as exc:  # noqa: BLE001
                print(f"  {label}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            line[label] = us
            res["rows"].append({"dims": name, "M": M, "cand": label, "us": us, "err": err, "bytes": case.bytes,
                                "pct_read": case.bytes / 1e6 / us / read * 100})
        from infera_ops.moe_decode.kernels import _gemv_gate_up_kernel, _gemv_down_sum_kernel
        E, H, I, K = DIMS[name]
        mk = M * K
        act = torch.empty(mk, I, dtype=torch.bfloat16, device="cuda")
        outb = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
        def gu(x, w13, w2, wt, ids):
            _gemv_gate_up_kernel[(mk, triton.cdiv(I, 16))](x, x.stride(0), w13, w13.stride(0), w13.stride(1), ids, act, H, I, K,
                BLOCK_I=16, BLOCK_H=256, USE_PDL=False, num_warps=4, num_stages=3)
        def dn(x, w13, w2, wt, ids):
            _gemv_down_sum_kernel[(triton.cdiv(H, 16), M)](act, w2, w2.stride(0), w2.stride(1), ids, wt, outb, outb.stride(0), H, I, K,
                BLOCK_N=16, BLOCK_K=256, USE_PDL=False, num_warps=4, num_stages=3)
        line["gemv-gate-up-alone"] = case.time_us(gu)
        line["gemv-down-alone"] = case.time_us(dn)
        best = min((v, k) for k, v in line.items() if "alone" not in k)
        floor = case.bytes / 1e6 / read
        print(f"{name:<17} M={M:<3} MB={case.bytes/1e6:7.1f} floor(read)={floor:6.1f}us best {best[1]} {best[0]:.1f}us "
              f"({floor/best[0]*100:.0f}% read) | " + " ".join(f"{k}={v:.1f}" for k, v in line.items()), flush=True)
    del w
    torch.cuda.empty_cache()
print(f"probe took {time.time()-t0:.0f}s")
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_probe.json"), "w"), indent=1)
