"""Per-kernel breakdown of the split form at M=1: gate/up alone, down alone, sum alone over block configs."""
import itertools, json, os, sys, time
sys.path.insert(0, "benchmarks")
import torch, triton
from bench_moe_decode import DIMS, Case, make_weights
from infera_ops.moe_decode.kernels import _moe_gate_up_kernel, _moe_down_kernel, _row_sum_kernel, block_m, block_mk

t0 = time.time()
torch.manual_seed(0)
gen = torch.Generator().manual_seed(0)
res = []
for name, M in [("qwen3-30b-a3b", 1), ("deepseek-v2-lite", 1), ("deepseek-v3", 1), ("qwen3-30b-a3b", 4)]:
    E, H, I, K = DIMS[name]
    w = make_weights(name)
    case = Case(w, name, M, gen)
    mk = M * K
    act = torch.randn(mk, I, device="cuda").to(torch.bfloat16)
    y = torch.empty(mk, H, dtype=torch.float32, device="cuda")
    out = torch.empty(M, H, dtype=torch.bfloat16, device="cuda")
    gu_mb = case.distinct * 2 * I * H * 2 / 1e6
    dn_mb = case.distinct * I * H * 2 / 1e6
    best_gu, best_dn = [], []
    for bi, bh, st, wp in itertools.product((32, 64, 128), (64, 128, 256), (3, 4), (4, 8)):
        def gu(x, w13, w2, wt, ids):
            _moe_gate_up_kernel[(mk, triton.cdiv(I, bi))](x, x.stride(0), w13, w13.stride(0), w13.stride(1), ids, act, act.stride(0),
                mk, H, I, K, BLOCK_MK=block_mk(mk), BLOCK_M=block_m(M), BLOCK_I=bi, BLOCK_H=bh, FP32_DOT=False, num_warps=wp, num_stages=st)
        try:
            us = case.time_us(gu)
        except Exception as exc:
            us = float("inf")
        best_gu.append((us, dict(block_i=bi, block_h=bh, stages=st, warps=wp)))
        res.append({"dims": name, "M": M, "kernel": "gate_up", "us": us, "pct": gu_mb / us / 4.38 * 100, **best_gu[-1][1]})
    for bn, bk, st, wp in itertools.product((16, 32, 64, 128), (64, 128, 256), (2, 3, 4), (4,)):
        def dn(x, w13, w2, wt, ids):
            _moe_down_kernel[(mk, triton.cdiv(H, bn))](act, act.stride(0), w2, w2.stride(0), w2.stride(1), ids, wt, y,
                mk, H, I, BLOCK_MK=block_mk(mk), BLOCK_M=block_m(M), BLOCK_N=bn, BLOCK_K=bk, FP32_DOT=False, USE_PDL=False,
                num_warps=wp, num_stages=st)
        try:
            us = case.time_us(dn)
        except Exception as exc:
            us = float("inf")
        best_dn.append((us, dict(block_n=bn, block_k=bk, stages=st, warps=wp)))
        res.append({"dims": name, "M": M, "kernel": "down", "us": us, "pct": dn_mb / us / 4.38 * 100, **best_dn[-1][1]})
    def sm(x, w13, w2, wt, ids):
        _row_sum_kernel[(M, triton.cdiv(H, 32))](y, out, out.stride(0), H, K, BLOCK_R=64, BLOCK_N=32, USE_PDL=False)
    sum_us = case.time_us(sm)
    best_gu.sort(key=lambda t: t[0]); best_dn.sort(key=lambda t: t[0])
    print(f"{name} M={M}: gate/up {gu_mb:.1f} MB floor {gu_mb/4.38:.1f} us; best 3: " + "; ".join(f"{u:.1f} {c}" for u, c in best_gu[:3]), flush=True)
    print(f"   down {dn_mb:.1f} MB floor {dn_mb/4.38:.1f} us; best 3: " + "; ".join(f"{u:.1f} {c}" for u, c in best_dn[:3]), flush=True)
    print(f"   sum {sum_us:.1f} us; worst gate/up {best_gu[-1][0]:.1f}, worst down {best_dn[-1][0]:.1f}", flush=True)
    del w
    torch.cuda.empty_cache()
print(f"took {time.time()-t0:.0f}s")
json.dump(res, open(os.path.join(os.environ.get("OUT", "/tmp"), "moe_parts.json"), "w"), indent=1)
