"""Triton SwiGLU MoE experts for a few tokens (decode), each selected expert's weights read once.

For tokens m = 0..M-1, each routed to TOPK experts e_mk with router weights r_mk (vLLM's layout):

    a_mk   = silu(W13[e_mk, :I] @ x_m) * (W13[e_mk, I:] @ x_m)          (gate half first, [I])
    out_m  = sum_k r_mk * (W2[e_mk] @ a_mk)                              ([H])

with ``W13: [E, 2I, H]`` and ``W2: [E, H, I]`` as vLLM stores them. At decode the cost is reading the
selected experts' weights (3·I·H elements each); the arithmetic is a GEMV. Several tokens may pick
the same expert, so the work is grouped by expert, not by (token, slot): program j (one per flat position
j = m·TOPK + k) reads every position's expert id; the program at the first position of its expert loads
that expert's weight tile once and applies it to every token that chose the expert (at most M, one row each
of a BLOCK_M tile, so the product is a ``tl.dot``); programs at later positions of the same expert exit at
once. No sort on the host side: the grouping is a BLOCK_MK-wide comparison inside each program (MK =
M·TOPK <= a few hundred at decode). Accumulation in fp32.

The down projection and the top-k sum come in two forms (``LaunchConfig.fused_sum``), both deterministic
(no atomics: the result does not depend on which program finishes first):

- expert-grouped (``_moe_down_kernel``, grid = positions x column blocks, like gate/up) writing each
  (token, slot) row in fp32, then a small kernel summing each token's TOPK rows in slot order
  (``_topk_sum_kernel``; M·TOPK·H·4 bytes, < 1% of the weight traffic at decode sizes);
- column-major (``_moe_down_sum_kernel``, grid = column blocks only): each program walks the distinct experts
  in order of first position and keeps every token's sum in registers, so the output is written once, in
  its dtype, with one launch fewer (a launch is ~2-3 us of a ~25 us step at M = 1), at the price of fewer,
  longer programs.
"""

import triton
import triton.language as tl

from infera_vllm.triton_dot import dot as _dot


@triton.jit
def _expert_rows(topk_ids_ptr, MK, BLOCK_MK: tl.constexpr, BLOCK_M: tl.constexpr):
    """For program j: its expert e, whether j is e's first flat position, and e's rows: a [BLOCK_M] mask and
    the flat positions (m·TOPK + k) of the tokens that chose e, in ascending order.

    The r-th row is the position whose running count of e (a cumulative sum over the BLOCK_MK ids) is r: a
    [BLOCK_M, BLOCK_MK] comparison instead of a sort kernel before the launch."""
    j = tl.program_id(0)
    e = tl.load(topk_ids_ptr + j)
    idx = tl.arange(0, BLOCK_MK)
    same = tl.load(topk_ids_ptr + idx, mask=idx < MK, other=-1) == e
    first = tl.sum((same & (idx < j)).to(tl.int32), axis=0) == 0
    rank = tl.cumsum(same.to(tl.int32), axis=0) - 1
    sel = same[None, :] & (rank[None, :] == tl.arange(0, BLOCK_M)[:, None])  # [BLOCK_M, BLOCK_MK]
    pos = tl.sum(tl.where(sel, idx[None, :], 0), axis=1).to(tl.int64)
    mine = tl.sum(sel.to(tl.int32), axis=1) > 0
    return e, first, mine, pos


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    topk_ids_ptr,  # [MK] expert id of each flat position m * TOPK + k (contiguous [M, TOPK], any int dtype)
    act_ptr,  # [MK, I] out: silu(gate) * up, in x's dtype
    act_row_stride,
    MK,
    H,
    I,
    TOPK,
    BLOCK_MK: tl.constexpr,  # next power of two >= MK: the width of the grouping comparison
    BLOCK_M: tl.constexpr,  # >= the most tokens one expert can have (M), >= 16 for tl.dot
    BLOCK_I: tl.constexpr,  # output columns (of I) per program
    BLOCK_H: tl.constexpr,  # reduction chunk along H
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
):
    pid_i = tl.program_id(1)
    e, first, mine, pos = _expert_rows(topk_ids_ptr, MK, BLOCK_MK, BLOCK_M)
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
    topk_ids_ptr,
    topk_weights_ptr,  # [MK] router weights, flat like topk_ids (any float dtype, read as fp32)
    y_ptr,  # [MK, H] fp32 out: r_mk * (W2[e_mk] @ a_mk)
    y_row_stride,
    MK,
    H,
    I,
    BLOCK_MK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # output columns (of H) per program
    BLOCK_K: tl.constexpr,  # reduction chunk along I
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
):
    pid_n = tl.program_id(1)
    e, first, mine, pos = _expert_rows(topk_ids_ptr, MK, BLOCK_MK, BLOCK_M)
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


@triton.jit
def _moe_down_sum_kernel(
    act_ptr,  # [MK, I] from the gate/up kernel
    act_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,  # [M, TOPK] contiguous
    topk_weights_ptr,  # [M, TOPK] contiguous, read as fp32
    out_ptr,  # [M, H] out: sum_k r_mk * (W2[e_mk] @ a_mk), in the output dtype
    out_row_stride,
    M,
    H,
    I,
    TOPK,
    BLOCK_M: tl.constexpr,  # >= M, >= 16 for tl.dot
    BLOCK_TOPK: tl.constexpr,  # >= TOPK (power of two)
    BLOCK_N: tl.constexpr,  # output columns (of H) per program
    BLOCK_K: tl.constexpr,  # reduction chunk along I
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    tok = tl.arange(0, BLOCK_M)
    slot = tl.arange(0, BLOCK_TOPK)
    flat = tok[:, None] * TOPK + slot[None, :]  # [BLOCK_M, BLOCK_TOPK] flat positions
    valid = (tok < M)[:, None] & (slot < TOPK)[None, :]
    ids = tl.load(topk_ids_ptr + flat, mask=valid, other=-1)
    router = tl.load(topk_weights_ptr + flat, mask=valid, other=0.0).to(tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for j in range(0, M * TOPK):  # experts in order of their first flat position
        e = tl.load(topk_ids_ptr + j)
        same = ids == e
        if tl.sum((same & (flat < j)).to(tl.int32)) == 0:
            # the tokens that chose e (top-k experts are distinct per token: at most one slot each)
            chose = tl.sum(same.to(tl.int32), axis=1) > 0
            pos = tl.sum(tl.where(same, flat, 0), axis=1).to(tl.int64)
            r = tl.sum(tl.where(same, router, 0.0), axis=1)
            w = w2_ptr + e.to(tl.int64) * w2_expert_stride + cols[None, :].to(tl.int64) * w2_row_stride
            part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, I, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                k_ok = k < I
                at = tl.load(act_ptr + pos[:, None] * act_row_stride + k[None, :], mask=chose[:, None] & k_ok[None, :],
                             other=0.0)
                part = _dot(at, tl.load(w + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0), part, FP32_DOT)
            acc += part * r[:, None]
    tl.store(out_ptr + tok[:, None].to(tl.int64) * out_row_stride + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(tok < M)[:, None] & col_ok[None, :])


@triton.jit
def _topk_sum_kernel(
    y_ptr,  # [M * TOPK, H] fp32 from the down kernel, contiguous
    out_ptr,  # [M, H] out: sum over the TOPK rows of each token, in the output dtype
    out_row_stride,
    H,
    TOPK,
    BLOCK_H: tl.constexpr,
):
    m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    ok = cols < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for k in range(TOPK):  # slot order: the same sum every run
        acc += tl.load(y_ptr + (m * TOPK + k).to(tl.int64) * H + cols, mask=ok, other=0.0)
    tl.store(out_ptr + m.to(tl.int64) * out_row_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)


class LaunchConfig:
    """Block sizes and pipelining (defaults; the per-GPU-family tuning file overrides them, see tuning.py).
    ``num_warps`` and ``num_stages`` apply to both GEMV kernels: at decode they stream weights, so the depth
    of the load pipeline (stages) matters more than the arithmetic layout. ``fused_sum``: the column-major
    down kernel with the top-k sum inside (module docstring)."""

    __slots__ = ("block_i", "block_h", "block_n", "block_k", "num_warps", "num_stages", "fused_sum")

    def __init__(self, block_i=64, block_h=128, block_n=64, block_k=128, num_warps=4, num_stages=3, fused_sum=False):
        self.block_i, self.block_h, self.block_n, self.block_k = block_i, block_h, block_n, block_k
        self.num_warps, self.num_stages, self.fused_sum = num_warps, num_stages, bool(fused_sum)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


def block_m(tokens: int) -> int:
    """Rows of the per-expert tile: every token that chose the expert (<= M), at least 16 for tl.dot."""
    return max(16, triton.next_power_of_2(tokens))


def block_mk(pairs: int) -> int:
    """Width of the grouping comparison (>= M·TOPK). At least 128 so every decode batch up to 16 tokens of
    top-8 shares one compiled kernel (no recompilation per batch size; the comparison is 16 x 128)."""
    return max(128, triton.next_power_of_2(pairs))
