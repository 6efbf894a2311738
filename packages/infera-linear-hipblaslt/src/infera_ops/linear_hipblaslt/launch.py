"""Launcher of the skinny-M linear (kernels.py) and its launch blocks (``LaunchConfig``). Capture-safe: no host
synchronisation, buffers from the current stream's allocator, grid sizes from shapes only.
"""

import torch
import triton

from infera_ops.linear_hipblaslt.kernels import _skinny_linear_kernel, _split_k_sum_kernel
from infera_vllm import triton_dot


class LaunchConfig:
    """Blocks of one tuned (shape, M bucket); the tuning table stores them (policy.py)."""

    __slots__ = ("block_m", "block_n", "block_k", "split_k", "num_warps", "num_stages")

    def __init__(self, block_m=16, block_n=32, block_k=256, split_k=1, num_warps=4, num_stages=3):
        self.block_m, self.block_n, self.block_k, self.split_k = block_m, block_n, block_k, split_k
        self.num_warps, self.num_stages = num_warps, num_stages
        if block_m < 16 or block_n < 16 or block_k < 16 or split_k < 1:
            raise ValueError(f"blocks must be >= 16 (tl.dot) and split_k >= 1: {self.as_dict()}")

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


SUM_BLOCK = 256


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, config: LaunchConfig,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[..., K] @ weight[N, K]^T + bias`` like ``F.linear``; x's leading dims are flattened (a view)."""
    K = x.shape[-1]
    N = weight.shape[0]
    if weight.shape[1] != K or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"need x [..., {weight.shape[1]}] and weight [N, K] with unit stride on K "
                         f"(x {tuple(x.shape)} stride {x.stride()}, "
                         f"weight {tuple(weight.shape)} stride {weight.stride()})")
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    y = torch.empty(*x.shape[:-1], N, dtype=x.dtype, device=x.device) if out is None else out
    y2 = y.view(-1, N)
    if M == 0:
        return y
    cfg = config
    fp32_dot = triton_dot.fp32_dot()
    k_per_split = triton.cdiv(triton.cdiv(K, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(K, k_per_split)
    grid = (triton.cdiv(N, cfg.block_n), triton.cdiv(M, cfg.block_m), split)
    has_bias = bias is not None
    target = y2 if split == 1 else torch.empty(split, M, N, dtype=torch.float32, device=x.device)
    _skinny_linear_kernel[grid](
        x2, x2.stride(0), weight, weight.stride(0), bias if has_bias else weight, target, y2.stride(0),
        M, N, K, k_per_split, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
        HAS_BIAS=has_bias, FP32_DOT=fp32_dot, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if split > 1:
        _split_k_sum_kernel[(M, triton.cdiv(N, SUM_BLOCK))](
            target, bias if has_bias else target, y2, y2.stride(0), M, N, split, HAS_BIAS=has_bias, BLOCK=SUM_BLOCK)
    return y
