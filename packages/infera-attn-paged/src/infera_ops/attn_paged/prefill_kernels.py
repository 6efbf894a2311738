"""Causal attention for ragged query batches over vLLM's paged KV cache: prefill, chunked prefill with
cached context, and mixed prefill + decode batches, one launch.

Request r has q_r query tokens at positions c_r .. c_r + q_r - 1, where c_r = L_r - q_r is its context
already in the cache (L_r = seq_lens[r]; every key, context and new, is read from the cache, which vLLM
writes before attention). Query token i of r, head q_g of KV head h, attends causally:

    s_gin  = scale · q_gi · k_n   for n in [lo_i, c_r + i],  lo_i = max(0, c_r + i - window_left) or 0
    o_gi   = sum_n exp(s_gin - m) v_n / (sum_n exp(s_gin - m) + exp(sink_g - m))

Work split (``_paged_prefill_kernel``, grid = (T // BLOCK_Q + R, Hkv)): a program takes BLOCK_Q consecutive
query tokens of one request and the G query heads of one KV head: BLOCK_M = BLOCK_Q·G rows (token-major),
so every K/V tile is read once for all of them. The program finds its request by binary search over the
query offsets (``query_start_loc``), with ``T // BLOCK_Q + R`` an upper bound on the blocks needed (each
request's last block may be partial); programs past their request's tokens exit. The key tiles at or
before the program's first query position are visible to all its rows and run without the causal mask;
only the tiles after it (at most BLOCK_Q / BLOCK_N + 1) are masked (every tile under a sliding window).
That second loop (``UNMASKED_TILES``) is off on ROCm, where the two loops' live state spills at D = 80
(gfx950, RDNA3); one masked loop serves there. The block table, lengths
and offsets are read as vLLM hands them over, no copies. Online softmax in fp32 with exp2; rows whose keys
are all masked in a tile (sliding windows) keep a safe maximum so no NaN arises.
"""

import triton
import triton.language as tl

from infera_ops.attn_paged.kernels import _attend_tile, _paged_kv, _with_sinks


@triton.jit
def _find_request(query_start_loc_ptr, pid, num_seqs, BLOCK_Q: tl.constexpr):
    """The request r whose q-blocks hold program ``pid``: the last r with start_r // BLOCK_Q + r <= pid."""
    left: tl.int32 = 0  # typed, as vLLM's find_seq_idx: a loop-carried value keeps one type when compiled
    right = num_seqs
    while left < right:
        mid = (left + right) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= pid:
            left = mid + 1
        else:
            right = mid
    return left - 1


@triton.jit
def _paged_prefill_kernel(
    q_ptr,  # [T, Hq, D], unit stride along D
    q_tok_stride,
    q_head_stride,
    k_ptr,  # [num_blocks, PAGE, Hkv, D]
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_ptr,
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    block_table_ptr,  # [R, max_pages] int32
    block_table_stride,
    seq_lens_ptr,  # [R] int32 keys per request, context + new tokens
    query_start_loc_ptr,  # [R + 1] int32 offsets of each request's tokens in q
    sinks_ptr,  # [Hq] fp32, read only when HAS_SINKS
    out_ptr,  # [T, Hq, D]
    out_tok_stride,
    out_head_stride,
    num_seqs,
    scale,
    softcap,
    window_left,
    G: tl.constexpr,  # query heads per KV head
    BLOCK_M: tl.constexpr,  # rows per program, a power of two >= G
    BLOCK_Q: tl.constexpr,  # query tokens per program: BLOCK_M // G
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    FP32_DOT: tl.constexpr,
    UNMASKED_TILES: tl.constexpr,  # the tiles every row sees whole in their own loop, without the causal mask
):
    pid = tl.program_id(0)
    h = tl.program_id(1)
    r = _find_request(query_start_loc_ptr, pid, num_seqs, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + r)
    q_len = tl.load(query_start_loc_ptr + r + 1) - q_start
    first = (pid - (q_start // BLOCK_Q + r)) * BLOCK_Q  # first query token (within r) of this program
    if first >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + r)
    ctx = seq_len - q_len

    rows = tl.arange(0, BLOCK_M)
    tok = first + rows // G
    heads = h * G + rows % G
    row_ok = (rows // G < BLOCK_Q) & (tok < q_len)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q_off = (q_start + tok).to(tl.int64)
    q = tl.load(q_ptr + q_off[:, None] * q_tok_stride + heads[:, None] * q_head_stride + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    pos = ctx + tok  # absolute position of each row's query token

    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    qk_scale = scale * 1.4426950408889634
    if HAS_SOFTCAP:
        qk_scale = scale
    hi = tl.minimum(ctx + first + BLOCK_Q, seq_len)  # one past the last key any row may see
    lo = 0
    if HAS_WINDOW:
        lo = tl.maximum(ctx + first - window_left, 0)
    bt_row = block_table_ptr + r.to(tl.int64) * block_table_stride
    k_head = k_ptr + h.to(tl.int64) * k_head_stride
    v_head = v_ptr + h.to(tl.int64) * v_head_stride
    # tiles every row sees whole (all keys at or before the first row's position) need no mask; with a
    # sliding window every tile is masked
    mid = lo
    if UNMASKED_TILES and not HAS_WINDOW:
        mid = lo + (ctx + first + 1 - lo) // BLOCK_N * BLOCK_N
        all_keys = tl.full([BLOCK_N], 1, tl.int1)
        for n0 in range(lo, mid, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            k, v = _paged_kv(k_head, v_head, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride, bt_row, n,
                             all_keys, d, d_ok, PAGE)
            m, l, acc = _attend_tile(q, k, v, all_keys[None, :], m, l, acc, qk_scale, softcap, HAS_SOFTCAP,
                                     FP32_DOT, False)
    for n0 in range(mid, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        k, v = _paged_kv(k_head, v_head, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride, bt_row, n, n_ok,
                         d, d_ok, PAGE)
        visible = n_ok[None, :] & (n[None, :] <= pos[:, None])  # causal
        if HAS_WINDOW:
            visible = visible & (n[None, :] >= pos[:, None] - window_left)
        m, l, acc = _attend_tile(q, k, v, visible, m, l, acc, qk_scale, softcap, HAS_SOFTCAP, FP32_DOT)

    if HAS_SINKS:
        acc, l = _with_sinks(acc, l, m, sinks_ptr, heads, row_ok)
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + q_off[:, None] * out_tok_stride + heads[:, None] * out_head_stride + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
