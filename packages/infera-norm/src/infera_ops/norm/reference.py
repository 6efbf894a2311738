"""fp32 torch references, shared by the tests and the benchmark (vLLM's native IR provider, in float32)."""

import torch


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    h = x.float()
    y = h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)
    return y * weight.float() if weight is not None else y


def fused_add_rms_norm_reference(x, residual, weight, eps):
    h = x.float() + residual.float()
    return rms_norm_reference(h, weight, eps), h
