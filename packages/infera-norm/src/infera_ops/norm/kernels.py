"""Triton RMSNorm and fused add+RMSNorm, several rows per program, optionally persistent.

Written for this project after vLLM's IR reference (``vllm/ir/ops/layernorm.py``) and Liger-Kernel's
``ops/rms_norm.py`` layout. Numerics follow vLLM's native provider exactly: the sum of squares and the
scaling in fp32, the normalised row rounded to the weight's dtype before the weight multiply.

Layout: ``x`` is ``[M, H]`` with an arbitrary row stride (a q/k view from a split is fine) and unit
column stride; outputs are written with their own row stride. In place is allowed (``y`` is ``x``,
``res_out`` is ``res``): each element is read before it is written, by the same program.
"""

import triton
import triton.language as tl


@triton.jit
def _rms_norm_fwd_kernel(
    x_ptr,
    x_row_stride,
    res_ptr,  # residual in (fused add only)
    res_row_stride,
    res_out_ptr,  # x + residual, in x's dtype (fused add only)
    res_out_row_stride,
    w_ptr,
    y_ptr,
    y_row_stride,
    M,
    H,
    eps,
    BLOCK_H: tl.constexpr,  # next power of two >= H: the whole row is in registers
    ROWS: tl.constexpr,  # rows per block: small H would leave most lanes idle with one row each
    FUSED_ADD: tl.constexpr,  # h = x + residual, write h to res_out and normalise h
    HAS_WEIGHT: tl.constexpr,
):
    """y_i = cast_w(h_i / sqrt(mean_j(h_j^2) + eps)) * w_i, with h = x (+ residual), per row.

    fp32 for the reduction and the scaling; for the fused form h is rounded to x's dtype before it is
    written back (as vLLM's reference does) but normalised in fp32, unrounded.

    Program p handles row blocks p, p + P, p + 2P, ... (P = programs launched): with P = number of
    blocks that is one block each; a smaller P makes the kernel persistent, loading the weight once per
    program and letting the launch's ``num_stages`` overlap the next block's loads with this one's maths.
    """
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    n_blocks = tl.cdiv(M, ROWS)
    cols = tl.arange(0, BLOCK_H)
    col_ok = cols < H
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0)
    for block in tl.range(pid, n_blocks, n_programs):
        rows = (block * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # int64: M * stride can exceed 2**31
        mask = (rows < M)[:, None] & col_ok[None, :]
        h = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if FUSED_ADD:
            r = tl.load(res_ptr + rows[:, None] * res_row_stride + cols[None, :], mask=mask, other=0.0)
            h = h + r.to(tl.float32)
            tl.store(res_out_ptr + rows[:, None] * res_out_row_stride + cols[None, :],
                     h.to(res_out_ptr.dtype.element_ty), mask=mask)
        rstd = tl.rsqrt(tl.sum(h * h, axis=1) / H + eps)
        y = h * rstd[:, None]
        if HAS_WEIGHT:
            # Round to the weight dtype first (vLLM's numerics), multiply in fp32: the product of two
            # 8-bit-mantissa values is exact in fp32, so the final rounding equals a bf16 multiply's, and
            # Triton's interpreter (CPU tests) has no bf16 arithmetic of its own. An fp32 weight
            # (GemmaRMSNorm's 1 + w) keeps the row in fp32, as vLLM's native provider does.
            y = y.to(w.dtype).to(tl.float32) * w.to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
