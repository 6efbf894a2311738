"""REPLACE_ME: the Triton kernels, ``@triton.jit`` functions only (launchers in launch.py).

The maths, in the notation the code uses, e.g. for a row-wise op over ``x: [M, H]``:

    y_m = f(x_m)                      (REPLACE_ME: the formula, the accumulation dtype, the rounding)

Work split: REPLACE_ME (what one program computes; grid = (cdiv(M, ROWS),)).
"""

import triton
import triton.language as tl


@triton.jit
def _REPLACE_ME_kernel(x_ptr, x_row_stride, y_ptr, y_row_stride, M, H,
                       BLOCK_H: tl.constexpr, ROWS: tl.constexpr):
    """``y[m, :] = x[m, :]`` for ROWS rows per program (REPLACE_ME with the op's maths).

    ``x_ptr``/``y_ptr``: ``[M, H]`` with unit column stride and the given row strides (elements).
    ``BLOCK_H``: columns per tile, a power of two >= H (one tile per row). ``ROWS``: rows per program.
    """
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_H)
    mask = (rows < M)[:, None] & (cols < H)[None, :]
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols[None, :], mask=mask, other=0.0)
    tl.store(y_ptr + rows[:, None] * y_row_stride + cols[None, :], x, mask=mask)
