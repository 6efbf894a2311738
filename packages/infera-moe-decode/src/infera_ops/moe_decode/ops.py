"""Launcher of the decode experts kernels: gate/up (grouped by expert inside the kernel), down, top-k sum.

Capture-safe: no host synchronisation, buffers allocated on the current stream (vLLM's graph pool when
captured), grid sizes from shapes only.
"""

import torch
import triton

from infera_ops.moe_decode.kernels import (LaunchConfig, _moe_down_kernel, _moe_down_sum_kernel, _moe_gate_up_kernel,
                                           _topk_sum_kernel, block_m, block_mk)
from infera_vllm import triton_dot

SUM_BLOCK_H = 256  # the top-k sum reads M·TOPK·H fp32: a few programs per token, any size works


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
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
        raise ValueError("x, w13, w2 and out need unit stride on their last dimension")
    if out is None:
        out = torch.empty(M, H, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    ids = topk_ids if topk_ids.is_contiguous() else topk_ids.contiguous()
    weights = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
    act = torch.empty(mk, inter, dtype=x.dtype, device=x.device)
    bm, bmk = block_m(M), block_mk(mk)
    fp32_dot = triton_dot.fp32_dot()
    _moe_gate_up_kernel[(mk, triton.cdiv(inter, cfg.block_i))](
        x, x.stride(0), w13, w13.stride(0), w13.stride(1), ids, act, act.stride(0),
        mk, H, inter, topk, BLOCK_MK=bmk, BLOCK_M=bm, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, FP32_DOT=fp32_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if cfg.fused_sum:
        _moe_down_sum_kernel[(triton.cdiv(H, cfg.block_n),)](
            act, act.stride(0), w2, w2.stride(0), w2.stride(1), ids, weights, out, out.stride(0), M, H, inter, topk,
            BLOCK_M=bm, BLOCK_TOPK=triton.next_power_of_2(topk), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            FP32_DOT=fp32_dot, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out
    y = torch.empty(mk, H, dtype=torch.float32, device=x.device)
    _moe_down_kernel[(mk, triton.cdiv(H, cfg.block_n))](
        act, act.stride(0), w2, w2.stride(0), w2.stride(1), ids, weights, y, y.stride(0),
        mk, H, inter, BLOCK_MK=bmk, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FP32_DOT=fp32_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _topk_sum_kernel[(M, triton.cdiv(H, SUM_BLOCK_H))](y, out, out.stride(0), H, topk, BLOCK_H=SUM_BLOCK_H)
    return out
