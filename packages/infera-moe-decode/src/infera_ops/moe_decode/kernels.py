"""Triton SwiGLU MoE experts for a few tokens (decode), each selected expert's weights read once.

For tokens m = 0..M-1, each routed to TOPK experts e_mk with router weights r_mk (vLLM's layout):

    a_mk   = silu(W13[e_mk, :I] @ x_m) * (W13[e_mk, I:] @ x_m)          (gate half first, [I])
    out_m  = sum_k r_mk * (W2[e_mk] @ a_mk)                              ([H])

with ``W13: [E, 2I, H]`` and ``W2: [E, H, I]`` as vLLM stores them. At decode the cost is reading the
selected experts' weights (3·I·H elements each); the arithmetic is a GEMV. Several tokens may pick the
same expert, so the work is grouped by expert, not by (token, slot): the (token, slot) pairs are sorted
by expert id (``sorted_ids``, with ``order`` = each sorted entry's flat position m·TOPK + k); the program
at sorted position j with the first occurrence of its expert loads that expert's weight tile once and
applies it to every token that chose the expert (at most M, one row each of a BLOCK_M tile, so the product
is a ``tl.dot``); programs at later occurrences exit at once. Accumulation in fp32.

The top-k reduction is a sum over TOPK fp32 rows per token done by the launcher after the down kernel
(M·TOPK·H·4 bytes, < 1% of the weight traffic at decode sizes) so the result does not depend on which
expert finishes first (no atomics).
"""

import triton
import triton.language as tl


@triton.jit
def _expert_rows(sorted_ids_ptr, order_ptr, MK, BLOCK_M: tl.constexpr):
    """For the program at sorted position j: its expert e, whether j is e's first occurrence, and e's rows
    (the sorted list is ascending, so they are j, j+1, ...): a mask and their flat token·TOPK + slot
    positions."""
    j = tl.program_id(0)
    e = tl.load(sorted_ids_ptr + j)
    prev = tl.load(sorted_ids_ptr + j - 1, mask=j > 0, other=-1)
    rows = j + tl.arange(0, BLOCK_M)
    mine = tl.load(sorted_ids_ptr + rows, mask=rows < MK, other=-1) == e
    pos = tl.load(order_ptr + rows, mask=mine, other=0).to(tl.int64)
    return e, (j == 0) | (prev != e), mine, pos


@triton.jit
def _dot(a, b, acc, FP32_DOT: tl.constexpr):
    """acc + a @ b. FP32_DOT: upcast first (Triton's CPU interpreter has no bf16 arithmetic: its bf16
    tl.dot multiplies raw bits); on GPUs the bf16/fp16 tensor-core dot with fp32 accumulation."""
    if FP32_DOT:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    sorted_ids_ptr,  # [MK] expert ids, ascending
    order_ptr,  # [MK] flat (token * TOPK + slot) position of each sorted entry
    act_ptr,  # [MK, I] out: silu(gate) * up, in x's dtype
    act_row_stride,
    MK,
    H,
    I,
    TOPK,
    BLOCK_M: tl.constexpr,  # >= the most tokens one expert can have (M), >= 16 for tl.dot
    BLOCK_I: tl.constexpr,  # output columns (of I) per program
    BLOCK_H: tl.constexpr,  # reduction chunk along H
    FP32_DOT: tl.constexpr,  # see _dot
):
    pid_i = tl.program_id(1)
    e, first, mine, pos = _expert_rows(sorted_ids_ptr, order_ptr, MK, BLOCK_M)
    if first:
        tok = pos // TOPK
        cols = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
        col_ok = cols < I
        w_gate = w13_ptr + e.to(tl.int64) * w13_expert_stride + cols[None, :].to(tl.int64) * w13_row_stride
        w_up = w_gate + I * w13_row_stride
        acc_gate = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            h_ok = h < H
            xt = tl.load(x_ptr + tok[:, None] * x_row_stride + h[None, :], mask=mine[:, None] & h_ok[None, :], other=0.0)
            w_mask = h_ok[:, None] & col_ok[None, :]
            acc_gate = _dot(xt, tl.load(w_gate + h[:, None], mask=w_mask, other=0.0), acc_gate, FP32_DOT)
            acc_up = _dot(xt, tl.load(w_up + h[:, None], mask=w_mask, other=0.0), acc_up, FP32_DOT)
        act = acc_gate * tl.sigmoid(acc_gate) * acc_up
        tl.store(act_ptr + pos[:, None] * act_row_stride + cols[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=mine[:, None] & col_ok[None, :])


@triton.jit
def _moe_down_kernel(
    act_ptr,  # [MK, I] from the gate/up kernel
    act_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    sorted_ids_ptr,
    order_ptr,
    topk_weights_ptr,  # [MK] router weights (fp32), flat like order
    y_ptr,  # [MK, H] fp32 out: r_mk * (W2[e_mk] @ a_mk)
    y_row_stride,
    MK,
    H,
    I,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # output columns (of H) per program
    BLOCK_K: tl.constexpr,  # reduction chunk along I
    FP32_DOT: tl.constexpr,  # see _dot
):
    pid_n = tl.program_id(1)
    e, first, mine, pos = _expert_rows(sorted_ids_ptr, order_ptr, MK, BLOCK_M)
    if first:
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        col_ok = cols < H
        w = w2_ptr + e.to(tl.int64) * w2_expert_stride + cols[None, :].to(tl.int64) * w2_row_stride
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            k_ok = k < I
            at = tl.load(act_ptr + pos[:, None] * act_row_stride + k[None, :], mask=mine[:, None] & k_ok[None, :], other=0.0)
            acc = _dot(at, tl.load(w + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0), acc, FP32_DOT)
        r = tl.load(topk_weights_ptr + pos, mask=mine, other=0.0).to(tl.float32)
        tl.store(y_ptr + pos[:, None] * y_row_stride + cols[None, :], acc * r[:, None], mask=mine[:, None] & col_ok[None, :])


class LaunchConfig:
    """Block sizes (defaults; the per-GPU-family tuning file overrides them, see tuning.py)."""

    __slots__ = ("block_i", "block_h", "block_n", "block_k", "num_warps")

    def __init__(self, block_i=64, block_h=128, block_n=64, block_k=128, num_warps=4):
        self.block_i, self.block_h, self.block_n, self.block_k, self.num_warps = block_i, block_h, block_n, block_k, num_warps

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


def block_m(tokens: int) -> int:
    """Rows of the per-expert tile: every token that chose the expert (<= M), at least 16 for tl.dot."""
    return max(16, triton.next_power_of_2(tokens))
