"""Launchers for the Triton kernels (plain functions; the vLLM IR provider wraps them in the next step)."""

import torch

from infera_ops.norm.kernels import LaunchConfig, _rms_norm_fwd_kernel, launch_config


def _rows(t: torch.Tensor) -> torch.Tensor:
    """[..., H] -> [M, H] without copying when the leading dims collapse; the kernel needs unit column stride."""
    if t.stride(-1) != 1:
        raise ValueError(f"the last dimension must be contiguous (stride {t.stride(-1)})")
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def _launch(x2, res2, res_out2, weight, y2, eps, config: LaunchConfig | None = None):
    M, H = x2.shape
    if M == 0:
        return
    cfg = config or launch_config(M, H, res2 is not None)
    _rms_norm_fwd_kernel[(cfg.programs,)](
        x2, x2.stride(0),
        res2 if res2 is not None else x2, res2.stride(0) if res2 is not None else 0,
        res_out2 if res_out2 is not None else y2, res_out2.stride(0) if res_out2 is not None else 0,
        weight if weight is not None else x2,
        y2, y2.stride(0), M, H, eps,
        BLOCK_H=cfg.block_h, ROWS=cfg.rows, FUSED_ADD=res2 is not None, HAS_WEIGHT=weight is not None,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    x2 = _rows(x)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    _launch(x2, None, None, weight, y.view(-1, x.shape[-1]), eps)
    return y


def fused_add_rms_norm(x, residual, weight, eps, out=None, residual_out=None) -> tuple[torch.Tensor, torch.Tensor]:
    x2, r2 = _rows(x), _rows(residual)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    res_out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual_out is None else residual_out
    H = x.shape[-1]
    _launch(x2, r2, res_out.view(-1, H), weight, y.view(-1, H), eps)
    return y, res_out
