"""Launcher of the decode experts kernels: sort the (token, slot) pairs by expert, gate/up, down, top-k sum.

Capture-safe: no host synchronisation, buffers allocated on the current stream (vLLM's graph pool when
captured), grid sizes from shapes only.
"""

import os

import torch
import triton

from infera_ops.moe_decode.kernels import LaunchConfig, _moe_down_kernel, _moe_gate_up_kernel, block_m


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, out: torch.Tensor | None = None,
                config: LaunchConfig | None = None) -> torch.Tensor:
    """``out[M, H] = sum_k topk_weights[:, k] * W2[e] @ silu_and_mul(W13[e] @ x)`` (see kernels.py).

    x ``[M, H]``; w13 ``[E, 2I, H]``; w2 ``[E, H, I]`` (unit stride on their last dims); topk_* ``[M, TOPK]``.
    """
    cfg = config or LaunchConfig()
    M, H = x.shape
    E, two_i, _ = w13.shape
    inter = two_i // 2
    topk = topk_ids.shape[1]
    mk = M * topk
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("x, w13 and w2 need unit stride on their last dimension")
    if out is None:
        out = torch.empty(M, H, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    sorted_ids, order = torch.sort(topk_ids.reshape(-1).to(torch.int32), stable=True)
    order = order.to(torch.int32)
    act = torch.empty(mk, inter, dtype=x.dtype, device=x.device)
    y = torch.empty(mk, H, dtype=torch.float32, device=x.device)
    weights = topk_weights.reshape(-1).to(torch.float32)
    bm = block_m(M)
    fp32_dot = os.environ.get("TRITON_INTERPRET") == "1"  # kernels.py: _dot
    _moe_gate_up_kernel[(mk, triton.cdiv(inter, cfg.block_i))](
        x, x.stride(0), w13, w13.stride(0), w13.stride(1), sorted_ids, order, act, act.stride(0),
        mk, H, inter, topk, BLOCK_M=bm, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, FP32_DOT=fp32_dot, num_warps=cfg.num_warps)
    _moe_down_kernel[(mk, triton.cdiv(H, cfg.block_n))](
        act, act.stride(0), w2, w2.stride(0), w2.stride(1), sorted_ids, order, weights, y, y.stride(0),
        mk, H, inter, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FP32_DOT=fp32_dot, num_warps=cfg.num_warps)
    out.copy_(y.view(M, topk, H).sum(1))  # fixed order over the slots: deterministic
    return out
