"""Triton SwiGLU MoE experts for a few tokens (decode), each selected expert's weights read once.

For tokens m = 0..M-1, each routed to TOPK experts e_mk with router weights r_mk (vLLM's layout):

    a_mk   = silu(W13[e_mk, :I] @ x_m) * (W13[e_mk, I:] @ x_m)          (gate half first, [I])
    out_m  = sum_k r_mk * (W2[e_mk] @ a_mk)                              ([H])

with ``W13: [E, 2I, H]`` and ``W2: [E, H, I]`` as vLLM stores them. At decode the cost is reading the
selected experts' weights (3·I·H elements each); the arithmetic is a GEMV. Several tokens may pick
the same expert, so the work is grouped by expert, not by (token, slot): program j (one per flat position
j = m·TOPK + k) reads every position's expert id; the program at the first position of its expert loads
that expert's weight tiles once and applies them to every token that chose the expert (at most M, one row
each of a BLOCK_M tile, so the product is a ``tl.dot``); programs at later positions of the same expert exit
at once. No sort or align pass: the grouping is a BLOCK_MK-wide comparison inside each program (MK = M·TOPK
<= a few hundred at decode). Accumulation in fp32; the activation ``a`` is rounded to the weights' dtype
before the down projection, as vLLM's intermediate cache is.

An expert id below zero (an expert another rank holds under expert parallel, after vLLM's expert map)
contributes nothing: the program at that position writes its own partial row as zeros (a token may have
several such slots, so they are not grouped).

Five forms, all deterministic (the result does not depend on which program finishes first):

- fused (``_moe_fused_kernel``, grid = positions x I-blocks): each program computes one I-block of ``a``
  (reading 2·BLOCK_I rows of W13) and at once its share of the down projection, ``r · W2[e][:, block] @ a``
  over all of H (reading the BLOCK_I columns of W2), into an fp32 partial ``[MK, I/BLOCK_I, H]``; then
  ``_row_sum_kernel`` adds each token's TOPK·I/BLOCK_I partial rows. One weight pass, two launches, and as
  many programs as the gate/up pass alone; the partials (MK·(I/BLOCK_I)·H·4 bytes) stay in L2 at small M.
- persistent (``_moe_persistent_kernel``, a few programs per SM): the gate/up and down blocks of the split form
  below as one list of work items in one launch, a down item starting as soon as its expert's activation is
  complete (per-expert counters), so the DRAM stream does not drain and refill between the projections;
  then ``_row_sum_kernel``. Deterministic like the others: the counters order the work, never the sums.
- split (``_moe_gate_up_kernel`` writing ``a`` ``[MK, I]``, ``_moe_down_kernel`` writing
  ``r · W2[e] @ a`` per position ``[MK, H]`` fp32, ``_row_sum_kernel`` adding each token's TOPK rows): three
  launches, a small fp32 buffer; the better one once many tokens make the partials large.
- split_sum (the split form's gate/up kernel, then ``_moe_down_sum_kernel``: one program per token and
  column block walks the token's TOPK experts and writes ``out`` itself): two launches, no fp32 rows (with
  ``split_i`` > 1, several programs per column block over shares of its expert tiles, merged in the
  kernel); each token reads its experts' W2 rows itself (no grouping in the down pass), so it suits one or
  a few tokens.
- stream (``_moe_stream_kernel``, one launch of a few programs per SM, no grouping at all): every program
  streams one balanced chunk of the gate/up weights and then one of the down weights, each chunk one
  pipelined loop across its units and experts, the top-k sum inside; the down chunks wait for all gate/up
  chunks (a counter) and may ask L2 for their W2 rows first. One launch and one pipeline fill per program
  instead of two launches, for one or a few tokens.

FP8 weights (``W_SCALED``, the split and split_sum forms' kernels): ``W[e, n, k] = Wq[e, n, k] *
s[e, n // GROUP_N, k // GROUP_K]``; each tile of ``Wq`` is converted to the activations' dtype (exact for
e4m3) and each reduction chunk's product, which lies inside one scale group along k, is scaled per output
column in fp32 (``_group_scales``). The activations are not quantized.

In the split form each kernel has a fixed cost (its first loads, its last programs finishing alone) of
several microseconds: at M = 1 on Qwen3-30B-A3B dims the H200 measures 15.8 us for the gate/up kernel
against 11.5 us of traffic at its read bandwidth, 9.5 us for the down kernel against 5.7. With ``USE_PDL``
each kernel after the first is a programmatic dependent of the one before (it launches while that one
drains and waits for its writes), and with ``PREFETCH_DOWN`` each gate/up program, once its own tiles are
done, asks L2 to fetch its share of the same expert's W2
(``prefetch.global.L2``), so the DRAM stays busy through the gate/up kernel's tail and the down kernel
reads from L2. Only worth it while the W2 of the experts in play fits in L2 beside the gate/up stream.
With ``EARLY_DOWN`` (and PDL) the gate/up kernel releases the down kernel as soon as all its programs have
started, and each down program, before it waits for the activations, prefetches its own rows of W2 into L2
(``evict_last``) while the gate/up weights stream past with ``evict_first``: the down kernel's traffic
overlaps the gate/up kernel on the SMs it leaves free (at M = 1 on Qwen3 dims the gate/up kernel has 96-192
programs for 132 SMs), and its reads after the wait come from L2.
"""

import triton
import triton.language as tl

from infera_vllm.triton_dot import dot as _dot

try:  # programmatic dependent launch (Triton >= 3.4 on CUDA); only traced when USE_PDL is set
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: USE_PDL stays off (triton_dot.pdl_supported)
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _expert_rows(topk_ids_ptr, j, MK, BLOCK_MK: tl.constexpr, BLOCK_M: tl.constexpr):
    """For flat position j: its expert e, whether j is e's first flat position, and e's rows: a [BLOCK_M] mask and
    the flat positions (m·TOPK + k) of the tokens that chose e, in ascending order.

    The r-th row is the position whose running count of e (a cumulative sum over the BLOCK_MK ids) is r: a
    [BLOCK_M, BLOCK_MK] comparison instead of a sort kernel before the launch."""
    e = tl.load(topk_ids_ptr + j)
    idx = tl.arange(0, BLOCK_MK)
    same = tl.load(topk_ids_ptr + idx, mask=idx < MK, other=-(2**30)) == e
    first = tl.sum((same & (idx < j)).to(tl.int32), axis=0) == 0
    rank = tl.cumsum(same.to(tl.int32), axis=0) - 1
    sel = same[None, :] & (rank[None, :] == tl.arange(0, BLOCK_M)[:, None])  # [BLOCK_M, BLOCK_MK]
    pos = tl.sum(tl.where(sel, idx[None, :], 0), axis=1).to(tl.int64)
    mine = tl.sum(sel.to(tl.int32), axis=1) > 0
    return e, first, mine, pos


@triton.jit
def _swiglu_block(x_ptr, x_row_stride, w13_ptr, w13_row_stride, tok, mine, cols, col_ok, H, I,
                  BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr, FP32_DOT: tl.constexpr,
                  EVICT_FIRST: tl.constexpr, s_ptr, s_row_stride, s_col_stride, GROUP_N, GROUP_K,
                  W_SCALED: tl.constexpr):
    """silu(x W_gate^T) * (x W_up^T) for the token rows ``tok`` (masked by ``mine``) and the I-columns
    ``cols`` of one expert (``w13_ptr`` at that expert): [BLOCK_M, BLOCK_I] fp32, 0 where masked.
    ``EVICT_FIRST``: the weight loads stream past L2 lines kept for later (``evict_first``). A bool, passed
    by every caller: Triton 3.6 fails on a string constexpr defaulted in a nested jit function.
    ``W_SCALED`` (FP8 weights, see ``_group_scales``): weight element (n, h) of the expert is
    ``W13[n, h] * s[n // GROUP_N, h // GROUP_K]`` (``s_ptr`` at the expert's scales, strides in elements, 0
    for a scale shared along that dimension); each BLOCK_H chunk lies inside one group along H (the launcher
    makes BLOCK_H divide GROUP_K), so a chunk's product is scaled per column once, in fp32."""
    w_gate = w13_ptr + cols[None, :].to(tl.int64) * w13_row_stride
    w_up = w_gate + I * w13_row_stride
    acc_gate = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        h_ok = h < H
        xt = tl.load(x_ptr + tok[:, None] * x_row_stride + h[None, :], mask=mine[:, None] & h_ok[None, :], other=0.0)
        w_mask = h_ok[:, None] & col_ok[None, :]
        if EVICT_FIRST:
            gate = tl.load(w_gate + h[:, None], mask=w_mask, other=0.0, eviction_policy="evict_first")
            up = tl.load(w_up + h[:, None], mask=w_mask, other=0.0, eviction_policy="evict_first")
        else:
            gate = tl.load(w_gate + h[:, None], mask=w_mask, other=0.0)
            up = tl.load(w_up + h[:, None], mask=w_mask, other=0.0)
        if W_SCALED:
            s_gate = _group_scales(s_ptr, s_row_stride, s_col_stride, cols, h0, GROUP_N, GROUP_K, col_ok)
            s_up = _group_scales(s_ptr, s_row_stride, s_col_stride, I + cols, h0, GROUP_N, GROUP_K, col_ok)
            zero = tl.zeros((BLOCK_M, BLOCK_I), dtype=tl.float32)
            acc_gate += _dot(xt, gate.to(xt.dtype), zero, FP32_DOT) * s_gate[None, :]
            acc_up += _dot(xt, up.to(xt.dtype), zero, FP32_DOT) * s_up[None, :]
        else:
            acc_gate = _dot(xt, gate, acc_gate, FP32_DOT)
            acc_up = _dot(xt, up, acc_up, FP32_DOT)
    return acc_gate * tl.sigmoid(acc_gate) * acc_up


@triton.jit
def _group_scales(s_ptr, s_row_stride, s_col_stride, rows, k0, GROUP_N, GROUP_K, ok):
    """The dequantization scales of weight rows ``rows`` (output channels) at reduction index ``k0``:
    ``s[rows // GROUP_N, k0 // GROUP_K]``, fp32 (1 where masked). One layout serves every FP8 scheme vLLM
    gives the experts: 128 x 128 blocks (GROUP_N = GROUP_K = 128), per channel (GROUP_N = 1, column stride
    0), per tensor (both strides 0), and gate and up halves scaled apart (GROUP_N = I)."""
    return tl.load(s_ptr + (rows // GROUP_N).to(tl.int64) * s_row_stride + (k0 // GROUP_K) * s_col_stride,
                   mask=ok, other=1.0).to(tl.float32)


@triton.jit
def _moe_fused_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,  # [MK] expert id of each flat position m * TOPK + k (contiguous [M, TOPK], any int dtype)
    topk_weights_ptr,  # [MK] router weights, flat like topk_ids (any float dtype, read as fp32)
    part_ptr,  # [MK, NUM_I_BLOCKS, H] fp32 out: r_mk * W2[e_mk][:, block] @ a_mk[block], contiguous
    MK,
    H,
    I,
    TOPK,
    BLOCK_MK: tl.constexpr,  # next power of two >= MK: the width of the grouping comparison
    BLOCK_M: tl.constexpr,  # >= the most tokens one expert can have (M), >= 16 for tl.dot
    BLOCK_I: tl.constexpr,  # columns of I per program (the gate/up output block = the down reduction block)
    BLOCK_H: tl.constexpr,  # gate/up reduction chunk along H
    BLOCK_N: tl.constexpr,  # down output chunk along H
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
    USE_PDL: tl.constexpr,  # let the sum kernel launch early (programmatic dependent launch)
):
    pid_i = tl.program_id(1)
    n_blocks = tl.num_programs(1)
    e, first, mine, pos = _expert_rows(topk_ids_ptr, tl.program_id(0), MK, BLOCK_MK, BLOCK_M)
    if e < 0:  # an expert held elsewhere: this position's partial row is zero
        own_row = part_ptr + (tl.program_id(0).to(tl.int64) * n_blocks + pid_i) * H
        for n0 in range(0, H, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            tl.store(own_row + n, tl.zeros((BLOCK_N,), dtype=tl.float32), mask=n < H)
    elif first:
        tok = pos // TOPK
        cols = pid_i * BLOCK_I + tl.arange(0, BLOCK_I)
        col_ok = cols < I
        act = _swiglu_block(x_ptr, x_row_stride, w13_ptr + e.to(tl.int64) * w13_expert_stride, w13_row_stride,
                            tok, mine, cols, col_ok, H, I, BLOCK_M, BLOCK_I, BLOCK_H, FP32_DOT, False,
                            x_ptr, 0, 0, 1, 1, False)
        act = act.to(w2_ptr.dtype.element_ty)
        r = tl.load(topk_weights_ptr + pos, mask=mine, other=0.0).to(tl.float32)
        part_rows = part_ptr + (pos[:, None] * n_blocks + pid_i) * H
        w = w2_ptr + e.to(tl.int64) * w2_expert_stride + cols[:, None]  # [BLOCK_I, 1]: I runs down the tile
        for n0 in range(0, H, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < H
            wt = tl.load(w + n[None, :].to(tl.int64) * w2_row_stride, mask=col_ok[:, None] & n_ok[None, :], other=0.0)
            y = _dot(act, wt, tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), FP32_DOT)
            tl.store(part_rows + n[None, :], y * r[:, None], mask=mine[:, None] & n_ok[None, :])
    if USE_PDL:
        gdc_launch_dependents()


@triton.jit
def _prefetch_l2(ptrs, mask):
    """``prefetch.global.L2`` of each address where ``mask``: a hint, no value (the int32 result is unused)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_l2_keep(ptrs, mask):
    """``prefetch.global.L2::evict_last`` of each address where ``mask``: fetched into L2 and kept there over
    lines loaded ``evict_first`` (sm80+)."""
    return tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    topk_ids_ptr,  # [MK] as in _moe_fused_kernel
    act_ptr,  # [MK, I] out: silu(gate) * up, in x's dtype
    act_row_stride,
    MK,
    H,
    I,
    TOPK,
    COLS,  # output columns (of I) per program, <= BLOCK_I: the tile's first COLS rows are this program's
    w2_ptr,  # [E, H, I] contiguous: prefetched into L2 when PREFETCH_DOWN
    s13_ptr,  # W_SCALED: fp32 scales of W13, s13[e, n // GROUP_N, h // GROUP_K] (_group_scales); else unread
    s13_expert_stride,
    s13_row_stride,
    s13_col_stride,
    GROUP_N,
    GROUP_K,
    BLOCK_MK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,  # the tile along I (a power of two >= COLS)
    BLOCK_H: tl.constexpr,  # reduction chunk along H
    FP32_DOT: tl.constexpr,
    PREFETCH_DOWN: tl.constexpr,  # after its tiles, prefetch 1/num_programs(1) of W2[e] into L2 (CUDA only)
    PREFETCH_BLOCK: tl.constexpr,  # addresses per prefetch step, one per 128-byte line
    USE_PDL: tl.constexpr,  # let the down kernel launch early (programmatic dependent launch)
    EARLY_DOWN: tl.constexpr,  # with USE_PDL: release the down kernel at once, stream W13 evict_first
    W_SCALED: tl.constexpr,  # FP8 weights: dequantized in the kernel by the s13 scales (bf16/fp16 products)
):
    if USE_PDL and EARLY_DOWN:
        gdc_launch_dependents()
    pid_i = tl.program_id(1)
    e, first, mine, pos = _expert_rows(topk_ids_ptr, tl.program_id(0), MK, BLOCK_MK, BLOCK_M)
    if first and e >= 0:  # an expert held elsewhere has no activation: the down kernel writes its row as zero
        cols = pid_i * COLS + tl.arange(0, BLOCK_I)
        col_ok = (tl.arange(0, BLOCK_I) < COLS) & (cols < I)  # masked rows are not read: no traffic
        act = _swiglu_block(x_ptr, x_row_stride, w13_ptr + e.to(tl.int64) * w13_expert_stride, w13_row_stride,
                            pos // TOPK, mine, cols, col_ok, H, I, BLOCK_M, BLOCK_I, BLOCK_H, FP32_DOT, EARLY_DOWN,
                            s13_ptr + e.to(tl.int64) * s13_expert_stride, s13_row_stride, s13_col_stride, GROUP_N,
                            GROUP_K, W_SCALED)
        tl.store(act_ptr + pos[:, None] * act_row_stride + cols[None, :], act.to(act_ptr.dtype.element_ty),
                 mask=mine[:, None] & col_ok[None, :])
        if PREFETCH_DOWN:
            line = 128 // w2_ptr.dtype.element_ty.primitive_bitwidth * 8  # elements per 128-byte line
            share = tl.cdiv(tl.cdiv(H * I, line), tl.num_programs(1)) * line
            start = pid_i.to(tl.int64) * share
            base = w2_ptr + e.to(tl.int64) * H * I
            for off in range(0, share, PREFETCH_BLOCK * line):
                idx = start + off + tl.arange(0, PREFETCH_BLOCK).to(tl.int64) * line
                _prefetch_l2(base + idx, (idx < H * I) & (idx < start + share))
    if USE_PDL and not EARLY_DOWN:
        gdc_launch_dependents()


@triton.jit
def _moe_down_kernel(
    act_ptr,  # [MK, I] from the gate/up kernel
    act_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,
    topk_weights_ptr,  # [MK] router weights, flat like topk_ids (any float dtype, read as fp32)
    y_ptr,  # [MK, H] fp32 out: r_mk * (W2[e_mk] @ a_mk), contiguous
    MK,
    H,
    I,
    s2_ptr,  # W_SCALED: fp32 scales of W2, s2[e, h // GROUP_N, i // GROUP_K] (_group_scales); else unread
    s2_expert_stride,
    s2_row_stride,
    s2_col_stride,
    GROUP_N,
    GROUP_K,
    BLOCK_MK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,  # output columns (of H) per program
    BLOCK_K: tl.constexpr,  # reduction chunk along I
    FP32_DOT: tl.constexpr,
    USE_PDL: tl.constexpr,  # a programmatic dependent of the gate/up kernel, and lets the sum launch early
    EARLY_DOWN: tl.constexpr,  # with USE_PDL: prefetch this program's W2 rows into L2 before the wait
    W_SCALED: tl.constexpr,  # FP8 weights: dequantized in the kernel by the s2 scales
):
    pid_n = tl.program_id(1)
    e, first, mine, pos = _expert_rows(topk_ids_ptr, tl.program_id(0), MK, BLOCK_MK, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    if USE_PDL and EARLY_DOWN:  # the weights do not depend on the gate/up kernel: fetch them while it runs
        if first and e >= 0:
            line = 128 // w2_ptr.dtype.element_ty.primitive_bitwidth * 8  # elements per 128-byte line
            rows = w2_ptr + e.to(tl.int64) * w2_expert_stride + cols[:, None].to(tl.int64) * w2_row_stride
            for k0 in range(0, I, 8 * line):
                k = k0 + tl.arange(0, 8) * line
                _prefetch_l2_keep(rows + k[None, :], col_ok[:, None] & (k < I)[None, :])
    if USE_PDL:
        gdc_wait()
    if e < 0:  # an expert held elsewhere: this position's row is zero
        tl.store(y_ptr + tl.program_id(0).to(tl.int64) * H + cols, tl.zeros((BLOCK_N,), dtype=tl.float32), mask=col_ok)
    elif first:
        _down_block(act_ptr, act_row_stride, w2_ptr + e.to(tl.int64) * w2_expert_stride, w2_row_stride,
                    topk_weights_ptr, y_ptr, pos, mine, cols, col_ok, H, I, BLOCK_M, BLOCK_N, BLOCK_K, FP32_DOT, False,
                    s2_ptr + e.to(tl.int64) * s2_expert_stride, s2_row_stride, s2_col_stride, GROUP_N, GROUP_K,
                    W_SCALED)
    if USE_PDL:
        gdc_launch_dependents()


@triton.jit
def _moe_down_sum_kernel(
    act_ptr,  # [MK, I] from the gate/up kernel
    act_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,  # [MK] flat, position m·TOPK + k (an id below zero: an expert held elsewhere)
    topk_weights_ptr,  # [MK] router weights (any float dtype, read as fp32)
    out_ptr,  # [M, H] out, in the output dtype
    out_row_stride,
    part_ptr,  # [M, SPLIT_I, H] fp32: each I-share's sums (read only when SPLIT_I > 1)
    count_ptr,  # int32 [M · cdiv(H, BLOCK_N)]: zero on entry, left zero (read only when SPLIT_I > 1)
    H,
    I,
    TOPK,
    ITEMS_PER_SHARE,  # (slot, chunk of I) items per program along program_id 2
    s2_ptr,  # W_SCALED: fp32 scales of W2, s2[e, h // GROUP_N, i // GROUP_K] (_group_scales); else unread
    s2_expert_stride,
    s2_row_stride,
    s2_col_stride,
    GROUP_N,
    GROUP_K,
    BLOCK_T: tl.constexpr,  # >= TOPK, a power of two: the token's expert ids and weights held in registers
    BLOCK_N: tl.constexpr,  # output columns (of H) per program, >= 16
    BLOCK_K: tl.constexpr,  # reduction chunk along I
    SPLIT_I: tl.constexpr,  # programs per (token, column block), each over its share of I; 1: no merge
    FP32_DOT: tl.constexpr,
    USE_PDL: tl.constexpr,  # a programmatic dependent of the gate/up kernel: wait for its activations
    W_SCALED: tl.constexpr,  # FP8 weights: dequantized in the kernel by the s2 scales (_down_block)
):
    """out[m, cols] = sum_k r_mk · (W2[e_mk][cols, :] @ a_mk) for one token m (program_id 0) and BLOCK_N
    output columns (program_id 1): the split form's down projection with the top-k sum inside, so there are
    no fp32 partial rows and no row-sum launch. The token's TOPK weight slices are walked as one loop of
    TOPK x (chunks of I) tiles (expert and chunk from the loop index, the ids from registers), so the load
    pipeline runs across experts without refilling; each slot's product is accumulated in fp32 and added,
    times its router weight, at the slot's last chunk (the same sums as the split form's rows). The token is
    row 0 of a 16-row tile (tl.dot's smallest M; the other rows are zeros). Tokens that share an expert each
    read its weights: the form for a few tokens over many experts.

    SPLIT_I > 1 (program_id 2 = s): the program walks only items [s·ITEMS_PER_SHARE, (s+1)·ITEMS_PER_SHARE)
    of that TOPK x chunks loop (item t = slot t // chunks, chunk t % chunks), so a one-token call has
    SPLIT_I times the programs, each with the same bytes to read (a share that ends inside a slot adds that
    slot's partial product times its router weight, and the next share the rest: the same sum); it stores
    its sums to ``part[m, s]`` and counts itself in at ``count[m, column block]`` (release); the program that
    counts last (acquire) adds the SPLIT_I shares in order s = 0, 1, ... (the result does not depend on
    which program is last), writes ``out`` and sets the count back to zero for the next launch or graph
    replay. Shares over the whole loop rather than over I alone let the grid be any multiple of the column
    blocks: Qwen3-30B-A3B at M = 1 has 32 column blocks of 64 and 8 x 6 items, so 4 shares give 128 programs
    of 12 tiles for 132 SMs (shares of I's 6 chunks give 96 or 192)."""
    m = tl.program_id(0).to(tl.int64)
    pid_n = tl.program_id(1)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < H
    slot = tl.arange(0, BLOCK_T)
    ids = tl.load(topk_ids_ptr + m * TOPK + slot, mask=slot < TOPK, other=-1).to(tl.int64)
    rw = tl.load(topk_weights_ptr + m * TOPK + slot, mask=slot < TOPK, other=0.0).to(tl.float32)
    if USE_PDL:
        gdc_wait()
    rows = tl.arange(0, 16)
    chunks = tl.cdiv(I, BLOCK_K)
    t_first = tl.program_id(2) * ITEMS_PER_SHARE
    t_end = tl.minimum(t_first + ITEMS_PER_SHARE, TOPK * chunks)  # this share's items (none past the last)
    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    total = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    for t in range(t_first, t_end):
        k_slot = t // chunks
        chunk = t - k_slot * chunks
        e = tl.sum(tl.where(slot == k_slot, ids, 0), axis=0)
        k = chunk * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = k < tl.where(e >= 0, I, 0)  # an expert held elsewhere: nothing loaded, nothing added
        a = tl.load(act_ptr + (m * TOPK + k_slot) * act_row_stride + rows[:, None] * 0 + k[None, :],
                    mask=(rows == 0)[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w2_ptr + tl.maximum(e, 0) * w2_expert_stride + cols[None, :].to(tl.int64) * w2_row_stride
                    + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if W_SCALED:
            s = _group_scales(s2_ptr + tl.maximum(e, 0) * s2_expert_stride, s2_row_stride, s2_col_stride, cols,
                              chunk * BLOCK_K, GROUP_N, GROUP_K, col_ok)
            acc += _dot(a, w.to(a.dtype), tl.zeros((16, BLOCK_N), dtype=tl.float32), FP32_DOT) * s[None, :]
        else:
            acc = _dot(a, w, acc, FP32_DOT)
        if (chunk == chunks - 1) | (t == t_end - 1):  # the slot's last chunk, or this share's last item
            total += acc * tl.sum(tl.where(slot == k_slot, rw, 0.0), axis=0)
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
    sums = tl.sum(total, axis=0)
    if SPLIT_I == 1:
        tl.store(out_ptr + m * out_row_stride + cols, sums.to(out_ptr.dtype.element_ty), mask=col_ok)
    else:
        share_ptr = part_ptr + m * SPLIT_I * H + cols
        tl.store(share_ptr + tl.program_id(2) * H, sums, mask=col_ok)
        tl.debug_barrier()  # every thread's stores before the release
        count = count_ptr + m * tl.num_programs(1) + pid_n
        if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == SPLIT_I - 1:  # the last share in
            tl.debug_barrier()
            merged = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for s in range(SPLIT_I):  # in order: the same sum whichever program is last
                merged += tl.load(share_ptr + s * H, mask=col_ok, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + m * out_row_stride + cols, merged.to(out_ptr.dtype.element_ty), mask=col_ok)
            tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")


@triton.jit
def _down_block(act_ptr, act_row_stride, w2_ptr, w2_row_stride, topk_weights_ptr, y_ptr, pos, mine, cols, col_ok,
                H, I, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
                ACT_FROM_L2: tl.constexpr, s_ptr, s_row_stride, s_col_stride, GROUP_N, GROUP_K, W_SCALED: tl.constexpr):
    """y[pos, cols] = r_pos * (a_pos @ W2[:, cols]^T) for the token rows ``pos`` (masked by ``mine``) of one
    expert (``w2_ptr`` at that expert), fp32. ``ACT_FROM_L2``: read ``a`` past L1 (``.cg``), for activations
    other programs of the same launch wrote. ``W_SCALED``: FP8 weights, ``W2[n, k] * s[n // GROUP_N, k //
    GROUP_K]`` as in ``_swiglu_block`` (BLOCK_K divides GROUP_K)."""
    w = w2_ptr + cols[None, :].to(tl.int64) * w2_row_stride
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < I
        a_ptrs = act_ptr + pos[:, None] * act_row_stride + k[None, :]
        a_mask = mine[:, None] & k_ok[None, :]
        if ACT_FROM_L2:
            at = tl.load(a_ptrs, mask=a_mask, other=0.0, cache_modifier=".cg")
        else:
            at = tl.load(a_ptrs, mask=a_mask, other=0.0)
        wt = tl.load(w + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        if W_SCALED:
            s = _group_scales(s_ptr, s_row_stride, s_col_stride, cols, k0, GROUP_N, GROUP_K, col_ok)
            acc += _dot(at, wt.to(at.dtype), tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), FP32_DOT) * s[None, :]
        else:
            acc = _dot(at, wt, acc, FP32_DOT)
    acc *= tl.load(topk_weights_ptr + pos, mask=mine, other=0.0).to(tl.float32)[:, None]
    tl.store(y_ptr + pos[:, None] * H + cols[None, :], acc, mask=mine[:, None] & col_ok[None, :])


@triton.jit
def _slot_position(flags, rank, r, idx):
    """The flat position whose rank among the ``flags`` positions is ``r``."""
    return tl.sum(tl.where(flags & (rank == r), idx, 0), axis=0)


@triton.jit
def _moe_persistent_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,  # [MK] as in _moe_fused_kernel
    topk_weights_ptr,  # [MK]
    act_ptr,  # [MK, I] scratch: silu(gate) * up, in the weights' dtype
    act_row_stride,
    y_ptr,  # [MK, H] fp32 out: r_mk * (W2[e_mk] @ a_mk), contiguous
    sync_ptr,  # int32 [2 + MK], zero on entry and left zero: next ticket, programs done, gate/up items done per expert
    MK,
    H,
    I,
    TOPK,
    BLOCK_MK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_I: tl.constexpr,  # gate/up item: I-columns
    BLOCK_H: tl.constexpr,  # gate/up reduction chunk along H
    BLOCK_N: tl.constexpr,  # down item: H-columns
    BLOCK_K: tl.constexpr,  # down reduction chunk along I
    FP32_DOT: tl.constexpr,
    USE_PDL: tl.constexpr,  # let the row sum launch early (programmatic dependent launch)
):
    """Both projections in one launch, so the weight stream does not drain between them.

    The work is a list of items: first every (expert, I-block) of the gate/up projection, then every (expert,
    H-block) of the down projection, expert by expert in the same order (then the positions of remote experts,
    whose rows are zero). Each program takes the next item from a ticket counter until none is left, so
    items are taken in ascending order. A gate/up item stores its activation block and counts it done for
    its expert (release); a down item waits until its expert's n_I gate/up items are done (acquire) before
    reading the activation. No wait can deadlock, whatever the grid and however many of its programs are
    resident: a program waits only on gate/up items, which come before every down item, so each was taken by
    a program that is running and that never waits while holding it. The grid (a few programs per SM) only
    sets how many items are in flight. The last program to finish zeroes the counters for the next launch (a
    CUDA graph replays with them zero).

    Experts (the ``local`` positions: the first position of each distinct expert id >= 0) are found in every
    program from the MK ids (each compared with every earlier one, 32 at a time); the r-th is picked by its
    rank. BLOCK_MK >= 32."""
    P = tl.num_programs(0)
    n_i = tl.cdiv(I, BLOCK_I)
    n_h = tl.cdiv(H, BLOCK_N)
    idx = tl.arange(0, BLOCK_MK)
    valid = idx < MK
    ids = tl.load(topk_ids_ptr + idx, mask=valid, other=0)
    seen_before = tl.zeros((BLOCK_MK,), dtype=tl.int32)
    for c0 in range(0, BLOCK_MK, 32):  # earlier positions with the same id, 32 at a time (registers)
        other = c0 + tl.arange(0, 32)
        other_ids = tl.load(topk_ids_ptr + other, mask=other < MK, other=0)
        seen_before += tl.sum(((ids[:, None] == other_ids[None, :]) & (other[None, :] < idx[:, None])).to(tl.int32),
                              axis=1)
    local = valid & (ids >= 0) & (seen_before == 0)
    remote = valid & (ids < 0)
    rank_local = tl.cumsum(local.to(tl.int32), axis=0) - 1
    n_local = tl.sum(local.to(tl.int32), axis=0)
    rank_down = tl.where(local, rank_local, n_local + tl.cumsum(remote.to(tl.int32), axis=0) - 1)
    n_gate_up = n_local * n_i
    total = n_gate_up + (n_local + tl.sum(remote.to(tl.int32), axis=0)) * n_h
    done_ptr = sync_ptr + 2

    t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    while t < total:
        if t < n_gate_up:
            r = t // n_i
            j = _slot_position(local, rank_local, r, idx)
            e, first, mine, pos = _expert_rows(topk_ids_ptr, j, MK, BLOCK_MK, BLOCK_M)
            i_cols = (t % n_i) * BLOCK_I + tl.arange(0, BLOCK_I)
            i_ok = i_cols < I
            act = _swiglu_block(x_ptr, x_row_stride, w13_ptr + e.to(tl.int64) * w13_expert_stride, w13_row_stride,
                                pos // TOPK, mine, i_cols, i_ok, H, I, BLOCK_M, BLOCK_I, BLOCK_H, FP32_DOT, False,
                            x_ptr, 0, 0, 1, 1, False)
            tl.store(act_ptr + pos[:, None] * act_row_stride + i_cols[None, :], act.to(act_ptr.dtype.element_ty),
                     mask=mine[:, None] & i_ok[None, :])
            tl.debug_barrier()  # every thread's stores before the release
            tl.atomic_add(done_ptr + r, 1, sem="release", scope="gpu")
        else:
            u = t - n_gate_up
            r = u // n_h
            j = _slot_position(local | remote, rank_down, r, idx)
            h_cols = (u % n_h) * BLOCK_N + tl.arange(0, BLOCK_N)
            h_ok = h_cols < H
            e, first, mine, pos = _expert_rows(topk_ids_ptr, j, MK, BLOCK_MK, BLOCK_M)
            if e < 0:  # an expert held elsewhere: this position's row is zero
                tl.store(y_ptr + j.to(tl.int64) * H + h_cols, tl.zeros((BLOCK_N,), dtype=tl.float32), mask=h_ok)
            else:
                ready = tl.atomic_add(done_ptr + r, 0, sem="acquire", scope="gpu")
                while ready < n_i:
                    ready = tl.atomic_add(done_ptr + r, 0, sem="acquire", scope="gpu")
                tl.debug_barrier()
                _down_block(act_ptr, act_row_stride, w2_ptr + e.to(tl.int64) * w2_expert_stride, w2_row_stride,
                            topk_weights_ptr, y_ptr, pos, mine, h_cols, h_ok, H, I, BLOCK_M, BLOCK_N, BLOCK_K,
                            FP32_DOT, True, x_ptr, 0, 0, 1, 1, False)
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:  # the last program out
        tl.store(done_ptr + idx, tl.zeros((BLOCK_MK,), dtype=tl.int32), mask=valid)
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
    if USE_PDL:
        gdc_launch_dependents()


@triton.jit
def _moe_stream_kernel(
    x_ptr,  # [M, H]
    x_row_stride,
    w13_ptr,  # [E, 2I, H], unit stride along H
    w13_expert_stride,
    w13_row_stride,
    w2_ptr,  # [E, H, I], unit stride along I
    w2_expert_stride,
    w2_row_stride,
    topk_ids_ptr,  # [MK] flat, position m·TOPK + k (an id below zero: an expert held elsewhere)
    topk_weights_ptr,  # [MK] router weights (any float dtype, read as fp32)
    act_ptr,  # [MK, I] scratch: silu(gate) * up per position, in the weights' dtype
    act_row_stride,
    out_ptr,  # [M, H] out, in the output dtype
    out_row_stride,
    sync_ptr,  # int32 [3], zero on entry and left zero: next ticket, programs out, gate/up chunks done
    M,
    H,
    I,
    TOPK,
    BLOCK_MK: tl.constexpr,  # next power of two >= M·TOPK: every position's expert id held in registers
    BLOCK_I: tl.constexpr,  # gate/up unit: columns of I (one position's)
    BLOCK_H: tl.constexpr,  # gate/up reduction chunk along H
    BLOCK_N: tl.constexpr,  # down unit: columns of H (one token's, all its TOPK experts)
    BLOCK_K: tl.constexpr,  # down reduction chunk along I
    FP32_DOT: tl.constexpr,
    PREFETCH_DOWN: tl.constexpr,  # CUDA: before its wait, a down chunk asks L2 for its W2 rows (evict_last)
    PREFETCH_BLOCK: tl.constexpr,  # addresses per prefetch step, one per 128-byte line
):
    """Both projections in one launch of P programs, each streaming its weights in one pipelined loop.

    The work is cut into 2·P chunks: chunk q < P holds the gate/up units [q·U/P, (q+1)·U/P) of the U =
    MK·cdiv(I, BLOCK_I) units (position j = u // n_I, its BLOCK_I columns of I: ``a_j[cols] =
    silu(W13[e_j, cols] @ x) * (W13[e_j, I + cols] @ x)``), chunk P + q the down units [q·D/P, (q+1)·D/P)
    of the D = M·cdiv(H, BLOCK_N) units (token m, its BLOCK_N columns of H: ``out_m[cols] = sum_k r_mk ·
    (W2[e_mk][cols, :] @ a_mk)``, the top-k sum inside, as ``_moe_down_sum_kernel`` has it). A chunk's units
    are one flat loop over their (unit, chunk of H) or (unit, slot, chunk of I) tiles, the unit and expert
    from the loop index, so the load pipeline runs across units and experts without refilling: at decode
    sizes the loss is each pipeline's fill and drain (several microseconds per launch at M = 1 on
    Qwen3-30B-A3B dims), and this form has one per program instead of one per launch and unit.

    Each program takes chunks from a ticket counter, in ascending order; a gate/up chunk stores its
    activations and counts itself done (release); a down chunk first asks L2 for its W2 rows
    (``PREFETCH_DOWN``, while the last gate/up chunks still stream), then waits until all P gate/up chunks
    are done (acquire), then reads the activations past L1. No wait can deadlock, whatever the grid and
    however many of its programs are resident: every gate/up chunk precedes every down chunk, so a waiting
    program waits only on chunks taken by programs that are running and that never wait while holding
    them. With P programs resident (one per SM) each takes one chunk of each kind. The last program out
    zeroes the counters for the next launch (a CUDA graph replays with them zero). Deterministic: every
    output element is written by one program in a fixed order.

    Positions are not grouped by expert: tokens that share an expert each read it (the form for one or a
    few tokens). An expert id below zero reads nothing and adds zero. Each token is row 0 of a 16-row tile
    (``tl.dot``'s smallest M; the other rows are zeros). Every position's expert id is loaded once into
    registers (with its router weight) and picked per tile by position: a weight address that came from a
    load inside the loop would keep the pipeliner from running the loads ahead (as in
    ``_moe_down_sum_kernel``)."""
    P = tl.num_programs(0)
    n_i = tl.cdiv(I, BLOCK_I)
    n_hc = tl.cdiv(H, BLOCK_H)
    n_h = tl.cdiv(H, BLOCK_N)
    n_kc = tl.cdiv(I, BLOCK_K)
    units_up = M * TOPK * n_i
    units_down = M * n_h
    tiles_down = TOPK * n_kc  # per down unit
    rows = tl.arange(0, 16)
    row0 = rows == 0
    done_ptr = sync_ptr + 2
    positions = tl.arange(0, BLOCK_MK)
    ids = tl.load(topk_ids_ptr + positions, mask=positions < M * TOPK, other=-1).to(tl.int64)
    router = tl.load(topk_weights_ptr + positions, mask=positions < M * TOPK, other=0.0).to(tl.float32)
    t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    while t < 2 * P:
        if t < P:
            acc_gate = tl.zeros((16, BLOCK_I), dtype=tl.float32)
            acc_up = tl.zeros((16, BLOCK_I), dtype=tl.float32)
            for s in range((t * units_up // P) * n_hc, ((t + 1) * units_up // P) * n_hc):
                u = s // n_hc
                hc = s - u * n_hc
                j = u // n_i
                e = tl.sum(tl.where(positions == j, ids, 0), axis=0)
                cols = (u - j * n_i) * BLOCK_I + tl.arange(0, BLOCK_I)
                col_ok = cols < tl.where(e >= 0, I, 0)  # an expert held elsewhere: nothing loaded
                h = hc * BLOCK_H + tl.arange(0, BLOCK_H)
                h_ok = h < H
                xt = tl.load(x_ptr + (j // TOPK) * x_row_stride + rows[:, None] * 0 + h[None, :],
                             mask=row0[:, None] & h_ok[None, :], other=0.0)
                w_gate = (w13_ptr + tl.maximum(e, 0) * w13_expert_stride + cols[None, :].to(tl.int64) * w13_row_stride
                          + h[:, None])
                w_mask = h_ok[:, None] & col_ok[None, :]
                if PREFETCH_DOWN:  # keep the W2 lines the down chunks ask L2 for
                    gate = tl.load(w_gate, mask=w_mask, other=0.0, eviction_policy="evict_first")
                    up = tl.load(w_gate + I * w13_row_stride, mask=w_mask, other=0.0, eviction_policy="evict_first")
                else:
                    gate = tl.load(w_gate, mask=w_mask, other=0.0)
                    up = tl.load(w_gate + I * w13_row_stride, mask=w_mask, other=0.0)
                acc_gate = _dot(xt, gate, acc_gate, FP32_DOT)
                acc_up = _dot(xt, up, acc_up, FP32_DOT)
                if hc == n_hc - 1:  # the unit's last chunk of H: its activations
                    act = tl.sum(acc_gate * tl.sigmoid(acc_gate) * acc_up, axis=0)  # rows 1..15 are zeros
                    tl.store(act_ptr + j * act_row_stride + cols, act.to(act_ptr.dtype.element_ty), mask=col_ok)
                    acc_gate = tl.zeros((16, BLOCK_I), dtype=tl.float32)
                    acc_up = tl.zeros((16, BLOCK_I), dtype=tl.float32)
            tl.debug_barrier()  # every thread's stores before the release
            tl.atomic_add(done_ptr, 1, sem="release", scope="gpu")
        else:
            q = t - P
            v_first = q * units_down // P
            v_end = (q + 1) * units_down // P
            if PREFETCH_DOWN:
                line = 128 // w2_ptr.dtype.element_ty.primitive_bitwidth * 8  # elements per 128-byte line
                lines = tl.cdiv(I, line)  # per W2 row
                for p in range(v_first * TOPK, v_end * TOPK):  # (unit, slot) pairs: BLOCK_N rows of one expert
                    v = p // TOPK
                    m = v // n_h
                    e = tl.sum(tl.where(positions == m * TOPK + (p - v * TOPK), ids, 0), axis=0)
                    first_row = (v - m * n_h) * BLOCK_N
                    base = w2_ptr + tl.maximum(e, 0) * w2_expert_stride + first_row.to(tl.int64) * w2_row_stride
                    for off in range(0, BLOCK_N * lines, PREFETCH_BLOCK):
                        idx = off + tl.arange(0, PREFETCH_BLOCK)
                        r = idx // lines
                        _prefetch_l2_keep(base + r.to(tl.int64) * w2_row_stride + (idx - r * lines) * line,
                                          (idx < BLOCK_N * lines) & (first_row + r < H) & (e >= 0))
            ready = tl.atomic_add(done_ptr, 0, sem="acquire", scope="gpu")
            while ready < P:
                ready = tl.atomic_add(done_ptr, 0, sem="acquire", scope="gpu")
            tl.debug_barrier()
            acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
            total = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for s in range(v_first * tiles_down, v_end * tiles_down):
                v = s // tiles_down
                rest = s - v * tiles_down
                k_slot = rest // n_kc
                chunk = rest - k_slot * n_kc
                m = v // n_h
                j = m * TOPK + k_slot
                e = tl.sum(tl.where(positions == j, ids, 0), axis=0)
                cols = (v - m * n_h) * BLOCK_N + tl.arange(0, BLOCK_N)
                col_ok = cols < H
                k = chunk * BLOCK_K + tl.arange(0, BLOCK_K)
                k_ok = k < tl.where(e >= 0, I, 0)
                a = tl.load(act_ptr + j * act_row_stride + rows[:, None] * 0 + k[None, :],
                            mask=row0[:, None] & k_ok[None, :], other=0.0, cache_modifier=".cg")
                w = tl.load(w2_ptr + tl.maximum(e, 0) * w2_expert_stride + cols[None, :].to(tl.int64) * w2_row_stride
                            + k[:, None], mask=k_ok[:, None] & col_ok[None, :], other=0.0)
                acc = _dot(a, w, acc, FP32_DOT)
                if chunk == n_kc - 1:  # the slot's last chunk of I: add it, times its router weight
                    total += tl.sum(acc, axis=0) * tl.sum(tl.where(positions == j, router, 0.0), axis=0)
                    acc = tl.zeros((16, BLOCK_N), dtype=tl.float32)
                    if k_slot == TOPK - 1:  # the unit's last slot: its columns of out
                        tl.store(out_ptr + m * out_row_stride + cols, total.to(out_ptr.dtype.element_ty), mask=col_ok)
                        total = tl.zeros((BLOCK_N,), dtype=tl.float32)
        t = tl.atomic_add(sync_ptr, 1, sem="relaxed", scope="gpu")
    tl.debug_barrier()
    if tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:  # the last program out
        tl.atomic_xchg(sync_ptr, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(sync_ptr + 1, 0, sem="relaxed", scope="gpu")
        tl.atomic_xchg(done_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _row_sum_kernel(
    rows_ptr,  # [M, R, H] fp32, contiguous: R partial rows per token
    out_ptr,  # [M, H] out: the sum over each token's R rows, in the output dtype
    out_row_stride,
    H,
    R,
    BLOCK_R: tl.constexpr,  # rows added per step (a fixed tree order: the same sum every run)
    BLOCK_N: tl.constexpr,  # output columns per program
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent: wait for the producer's writes
):
    if USE_PDL:
        gdc_wait()
    m = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ok = cols < H
    base = rows_ptr + m * R * H
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        acc += tl.sum(tl.load(base + r[:, None] * H + cols[None, :], mask=(r < R)[:, None] & ok[None, :], other=0.0),
                      axis=0)
    tl.store(out_ptr + m * out_row_stride + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)
