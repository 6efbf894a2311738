"""Triton skinny-M linear: ``y[M, N] = x[M, K] @ W[N, K]^T (+ bias[N])`` for decode-sized M.

At M <= 64 a bf16 linear is a weight stream: N·K·2 bytes read once, 2·M·N·K FLOPs that tensor cores do
in a fraction of the time. Each program owns BLOCK_N output columns (rows of W, contiguous along K) and up
to BLOCK_M tokens, and walks K in BLOCK_K chunks: a ``tl.dot`` of the [BLOCK_M, BLOCK_K] token tile with the
[BLOCK_K, BLOCK_N] weight tile, fp32 accumulation. With N / BLOCK_N programs too few to fill the GPU
(small N, large K), SPLIT_K > 1 splits K across programs: each writes an fp32 partial ``[SPLIT_K, M, N]``
and ``_split_k_sum_kernel`` adds them in split order (deterministic, no atomics), the bias and the cast.
"""

import triton
import triton.language as tl

from infera_vllm.triton_dot import dot as _dot


@triton.jit
def _skinny_linear_kernel(
    x_ptr,  # [M, K], unit stride along K
    x_row_stride,
    w_ptr,  # [N, K] (vLLM's / F.linear's layout), unit stride along K
    w_row_stride,
    bias_ptr,  # [N] or unused
    y_ptr,  # SPLIT_K == 1: [M, N] out in x's dtype; else the fp32 partials [SPLIT_K, M, N], contiguous
    y_row_stride,
    M,
    N,
    K,
    K_PER_SPLIT,  # multiple of BLOCK_K; K when SPLIT_K == 1
    BLOCK_M: tl.constexpr,  # tokens per program (>= 16 for tl.dot)
    BLOCK_N: tl.constexpr,  # output columns (rows of W) per program
    BLOCK_K: tl.constexpr,  # reduction chunk
    SPLIT_K: tl.constexpr,  # programs along K (1: no split, bias and cast fused here)
    HAS_BIAS: tl.constexpr,
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok, col_ok = rows < M, cols < N
    k_begin = pid_k * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    x_rows = x_ptr + rows[:, None].to(tl.int64) * x_row_stride
    w_cols = w_ptr + cols[None, :].to(tl.int64) * w_row_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < k_end
        xt = tl.load(x_rows + k[None, :], mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wt = tl.load(w_cols + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = _dot(xt, wt, acc, FP32_DOT)
    mask = row_ok[:, None] & col_ok[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + rows[:, None].to(tl.int64) * y_row_stride + cols[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=mask)
    else:
        part = y_ptr + pid_k.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
        tl.store(part, acc, mask=mask)


@triton.jit
def _split_k_sum_kernel(
    part_ptr,  # [SPLIT_K, M, N] fp32 partials, contiguous
    bias_ptr,  # [N] or unused
    y_ptr,  # [M, N] out
    y_row_stride,
    M,
    N,
    SPLIT_K,
    HAS_BIAS: tl.constexpr,
    BLOCK: tl.constexpr,  # output columns per program
):
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):  # split order: the same sum every run
        acc += tl.load(part_ptr + (s * M + m).to(tl.int64) * N + cols, mask=ok, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(y_ptr + m.to(tl.int64) * y_row_stride + cols, acc.to(y_ptr.dtype.element_ty), mask=ok)
