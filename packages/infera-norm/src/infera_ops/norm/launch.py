"""Launchers for the Triton kernels (kernels.py) and their launch sizes by shape: plain functions, which the
vLLM IR provider (seam.py) calls through its torch custom ops."""

import functools
from typing import NamedTuple

import torch
import triton

from infera_ops.norm.kernels import _rms_norm_fwd_kernel


class LaunchConfig(NamedTuple):
    block_h: int  # BLOCK_H
    rows: int  # ROWS
    num_warps: int
    programs: int  # grid size; < number of row blocks = persistent
    num_stages: int = 1


@functools.lru_cache(maxsize=8192)
def launch_config(M: int, H: int, fused_add: bool = False) -> LaunchConfig:
    """Launch parameters chosen by shape, from the H200 sweep in benchmarks/results/h200/norm-tune/
    (benchmarks/tune_norm.py: every rows x warps choice, persistent variants too, timed from CUDA graphs
    with inputs in L2 and from HBM). Each rule below is within 2% of the sweep's best in both modes
    unless noted.

    - BLOCK_H covers the row: one pass over memory, each element read once.
    - ROWS packs short rows so a block holds 2048 elements (4096 for rows of <= 1024 from M = 4096 on):
      at H = 576 four rows per block won 9-22% over two at M >= 4096 and lost 3% at M = 1024; at
      H = 2048 one row per block beat two almost everywhere (up to 8% at M = 1024, 3% at M = 16384).
    - num_warps: 4 up to 4096 elements per block, 8 up to 8192, 16 above (8-16 fp32 values per thread);
      the fused add at BLOCK_H = 4096 wants 8 below 1024 tokens (+3-7%: two loaded rows per thread, more
      loads in flight), and at BLOCK_H >= 4096 16 from 4096 tokens on (+1-3%, more bytes in flight).
    - one program per row block: the persistent variants (4 programs per SM looping with 2 stages) were
      never better from HBM and better with inputs in L2 only at H = 2048, M = 4096 (fused add).
    """
    block_h = triton.next_power_of_2(H)
    rows = max(1, (4096 if M >= 4096 and block_h <= 1024 else 2048) // block_h)
    tile = block_h * rows
    num_warps = 4 if tile <= 4096 else 8 if tile <= 8192 else 16
    if fused_add and block_h == 4096 and M < 1024:
        num_warps = 8
    if fused_add and block_h >= 4096 and M >= 4096:
        num_warps = 16
    return LaunchConfig(block_h, rows, num_warps, triton.cdiv(M, rows))


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
