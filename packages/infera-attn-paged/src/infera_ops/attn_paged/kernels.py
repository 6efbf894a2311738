"""The Triton kernels of infera-attn-paged: split-KV decode (one query token per sequence) and ragged causal
prefill, both over vLLM's paged KV cache.

## Decode

Split-KV (flash-decoding) attention over vLLM's paged KV cache: one query token per sequence.

For sequence b, KV head h and the G = Hq / Hkv query heads q_g that share it (grouped-query attention), with
the keys and values of positions n in [lo_b, L_b) gathered through the block table:

    s_gn   = scale · q_g · k_n                      (then cap · tanh(s / cap) when a logits soft-cap is set)
    o_g    = sum_n exp(s_gn - m_g) v_n / (sum_n exp(s_gn - m_g) + exp(sink_g - m_g))

where L_b = seq_lens[b], lo_b = max(0, L_b - 1 - window_left) under a sliding window (else 0), m_g the running
maximum, and the sink term present only for models with attention sinks (gpt-oss: one learned logit per
query head that takes probability mass but carries no value).

Work split (``_paged_decode_kernel``, grid = (B, Hkv, S)): S, the slice cap, is fixed on the host from the
batch size and head count only (launch.split_cap), so a CUDA graph captured for a batch size serves every
context length. Each sequence's own slice count is chosen on the device from its length:

    S_b = min(S, max(1, ceil((L_b - lo_b) / split_keys)))

so a slice holds at least ``split_keys`` keys (short sequences are not cut into slices whose fixed cost
outweighs their reads) and long sequences use every slice the batch leaves room for. Program (b, h, s) with
s < S_b takes the s-th of S_b equal, BLOCK_N-aligned slices of [lo_b, L_b); programs with s >= S_b exit at
once. Each loads the G query rows once and walks its slice in tiles of BLOCK_N positions, each K/V tile read
once for all G heads (a [BLOCK_G, D] x [D, BLOCK_N] tensor-core product), with the online softmax in fp32
and exp2.

A sequence with S_b = 1 is finished by its only program (normalised, sinks added, written to ``out``). With
S_b > 1 each program writes its normalised partial output and log2-sum-exp in fp32, and
``_paged_decode_reduce_kernel`` (grid = (B, Hq)) merges the S_b slices, BLOCK_S at a time with a running
maximum, adding the sink to the denominator; it recomputes S_b from the same length, so no per-sequence
count is stored. With ``USE_PDL`` the reduce is
launched as a programmatic dependent of the main kernel (Hopper and later), released by every main program
as it starts: its programs are resident by the time the main kernel drains and wait (``gdc_wait``) until
that grid has completed and its writes are visible, which hides the reduce's launch latency.

With ``MERGE`` there is no reduce launch: each program of a sequence with S_b > 1 writes its partial, then
counts itself in at its (sequence, KV head)'s counter (release); the program that counts last (acquire)
merges the S_b partials of its G heads itself (``_merge_group``: the reduce kernel's sums for the G heads at
once, [G, BLOCK_S, D] partials per step, so a small slice count costs one round trip to L2), writes ``out``
and sets the counter back to zero for the next launch or CUDA-graph replay; the result does not depend on
which program is last. A second dependent launch costs about 3 us on the H200 (a plain read of the same
bytes in two launches against one, benchmarks/results/h200/moe-decode/bench_moe_decode_stream_floor.json);
the merge costs the last program S_b / BLOCK_S dependent reads of its partials from L2 after its own slice,
so it pays at small slice caps (launch.SplitPolicy.merge_max_slices).

## Quantized KV caches

``KV_QUANT`` selects how the cache holds keys and values (vLLM's ``kv_cache_dtype``, TRITON_ATTN's layouts):
0, the query's dtype; 1 (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``), fp8 elements with one fp32 scale per cache,
k = k_scale · k_q, v = v_scale · v_q; 2 (``int8_per_token_head``, ``fp8_per_token_head``), int8 or fp8 elements
with an fp32 scale per (token, KV head) in scale caches of their own. Queries stay in their own dtype (bf16,
fp16): a tile of quantized elements is converted to it exactly (fp8 and int8 values are bf16/fp16 values) and
the scales are applied in fp32 outside the dots, so no product is taken in fp8:

    s_gn = scale · k_scale_n · (q_g · k_q,n)       o_g = sum_n p_gn v_scale_n v_q,n / sum_n p_gn

With one scale per cache, k_scale joins the logits' scale and v_scale multiplies the accumulated output once;
with a scale per (token, head), each tile's key scales multiply its logits' columns and its value scales the
probabilities that weigh the values (the softmax denominator keeps the unscaled probabilities).

Row alignment (``KV_ALIGN``): Triton vectorises a row's loads only as far as it can prove the row's address
aligned, and it proves 16 bytes from arguments that are multiples of 16, nothing otherwise. TRITON_ATTN's
per-(token, head) layout keeps each row's fp32 scale inline after its D bytes, so rows start at multiples
of 4 bytes only: unhinted, every element is its own one-byte load (and the tile's registers spill). The
launcher passes the alignment it finds (launch.kv_alignment) and rows below 16 are declared aligned to it.

## Prefill

Causal attention for ragged query batches over vLLM's paged KV cache: prefill, chunked prefill with
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

from infera_vllm.triton_dot import dot as _dot

try:  # programmatic dependent launch (Triton >= 3.4 on CUDA); only traced when USE_PDL is set
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - older Triton: USE_PDL stays off (triton_dot.pdl_supported)
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def _softcap(s, cap):
    """cap · tanh(s / cap), with tanh(x) = 1 - 2 / (exp(2x) + 1): exact at both ends (exp overflow -> 1)."""
    return cap * (1.0 - 2.0 / (tl.exp(2.0 * s / cap) + 1.0))


@triton.jit
def _paged_kv(k_head_ptr, v_head_ptr, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride, bt_row_ptr, n, n_ok,
              d, d_ok, k_scale_ptr, v_scale_ptr, scale_block_stride, scale_pos_stride, scale_head_stride, h, dtype,
              PAGE: tl.constexpr, KV_QUANT: tl.constexpr, KV_ALIGN: tl.constexpr):
    """(keys, values, key scales, value scales) of positions ``n`` (KV head h), gathered through the sequence's
    block-table row: position n lives at slot n % PAGE of physical block bt_row[n // PAGE]. Keys and values
    [BLOCK_N, BLOCK_D] in ``dtype`` (the query's: a quantized cache's elements converted exactly); the scales
    [BLOCK_N] fp32 from the per-(token, head) scale caches [num_blocks, PAGE, Hkv] where ``KV_QUANT`` is 2,
    else unused placeholders (module docstring, Quantized KV caches). ``KV_ALIGN`` < 16: every key and value
    row starts at a multiple of KV_ALIGN bytes, which the loads are told so they move KV_ALIGN bytes at a time
    (module docstring, Row alignment)."""
    blk = tl.load(bt_row_ptr + n // PAGE, mask=n_ok, other=0).to(tl.int64)
    pos = (n % PAGE).to(tl.int64)
    ok = n_ok[:, None] & d_ok[None, :]
    k_rows = k_head_ptr + (blk * k_block_stride + pos * k_pos_stride)
    v_rows = v_head_ptr + (blk * v_block_stride + pos * v_pos_stride)
    if KV_ALIGN < 16:
        k_rows = tl.multiple_of(k_rows, KV_ALIGN)
        v_rows = tl.multiple_of(v_rows, KV_ALIGN)
    k = tl.load(k_rows[:, None] + d[None, :], mask=ok, other=0.0)
    v = tl.load(v_rows[:, None] + d[None, :], mask=ok, other=0.0)
    if KV_QUANT == 2:
        at = blk * scale_block_stride + pos * scale_pos_stride + h.to(tl.int64) * scale_head_stride
        k_scales = tl.load(k_scale_ptr + at, mask=n_ok, other=0.0)
        v_scales = tl.load(v_scale_ptr + at, mask=n_ok, other=0.0)
    else:
        k_scales = n_ok
        v_scales = n_ok
    if KV_QUANT != 0:
        k = _as_query_dtype(k, dtype)
        v = _as_query_dtype(v, dtype)
    return k, v, k_scales, v_scales


@triton.jit
def _as_query_dtype(x, dtype):
    """A tile of cache elements in the query's dtype: exact for fp8 and int8 elements (int8 through fp32, the
    conversion Triton's interpreter gets right)."""
    if x.dtype == dtype:
        return x
    if x.dtype.is_int():
        return x.to(tl.float32).to(dtype)
    return x.to(dtype)


@triton.jit
def _attend_tile(q, k, v, visible, m, l, acc, qk_scale, softcap, HAS_SOFTCAP: tl.constexpr,
                 FP32_DOT: tl.constexpr, MASKED: tl.constexpr, k_col_scale, v_row_scale, TOKEN_SCALES: tl.constexpr):
    """One online-softmax step over a K/V tile: (m, l, acc) after adding the ``visible`` keys of this tile.

    Logits in the exp2 domain (``qk_scale`` holds log2 e unless a soft-cap is applied first). A row that has
    seen no visible key yet keeps m = -inf; its exponentials use 0 as the maximum, so no NaN arises.
    ``MASKED=False``: every key of the tile is visible to every row (``visible`` is not read), so neither the
    mask nor the -inf guard is applied. ``TOKEN_SCALES``: ``k`` and ``v`` hold quantized elements in q's
    dtype with one scale per key, ``k_col_scale`` and ``v_row_scale`` [BLOCK_N] fp32 (module docstring,
    Quantized KV caches)."""
    qk = _dot(q, tl.trans(k), tl.zeros([q.shape[0], k.shape[0]], tl.float32), FP32_DOT) * qk_scale
    if TOKEN_SCALES:
        qk = qk * k_col_scale[None, :]
    if HAS_SOFTCAP:
        qk = _softcap(qk, softcap) * 1.4426950408889634
    if MASKED:
        qk = tl.where(visible, qk, float("-inf"))
    m_new = tl.maximum(m, tl.max(qk, axis=1))
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    alpha = tl.exp2(m - m_use)
    p = tl.exp2(qk - m_use[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    if TOKEN_SCALES:
        acc = _dot((p * v_row_scale[None, :]).to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
    else:
        acc = _dot(p.to(v.dtype), v, acc * alpha[:, None], FP32_DOT)
    return m_new, l, acc


@triton.jit
def _with_sinks(acc, l, m, sinks_ptr, heads, ok):
    """(acc, l) with each row's sink logit added to the softmax denominator (no value), rescaled to the
    larger of the running maximum and the sink."""
    sink = tl.load(sinks_ptr + heads, mask=ok, other=float("-inf")).to(tl.float32) * 1.4426950408889634
    m_all = tl.maximum(m, sink)
    m_all = tl.where(m_all == float("-inf"), 0.0, m_all)
    scale = tl.exp2(m - m_all)
    return acc * scale[:, None], l * scale + tl.exp2(sink - m_all)


@triton.jit
def _slices_of(seq_len, window_left, split_keys, S, HAS_WINDOW: tl.constexpr):
    """(first key, slice count S_b) of a sequence of ``seq_len`` keys under a slice cap S."""
    start = 0
    if HAS_WINDOW:
        start = tl.maximum(seq_len - 1 - window_left, 0)
    n_slices = tl.minimum(tl.maximum(tl.cdiv(seq_len - start, split_keys), 1), S)
    return start, n_slices


@triton.jit
def _merge_group(part_out_ptr, part_lse_ptr, sinks_ptr, row0, hq0, G, n_slices, S, D: tl.constexpr,
                 BLOCK_GM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, HAS_SINKS: tl.constexpr):
    """[BLOCK_GM, BLOCK_D] fp32, for each of the G query heads hq = hq0 .. hq0 + G - 1 (partial rows
    row = row0 .. row0 + G - 1, a row being sequence · Hq + hq, its slices at row · S + s):

        o = sum_s 2^(lse_s - M) o_s / (sum_s 2^(lse_s - M) + 2^(sink·log2e - M)),  M = max over slices and sink

    over the ``n_slices`` slices, BLOCK_S at a time, each head's running sums rescaled to each step's maximum
    (a slice with no visible key has lse = -inf and weight 0). ``BLOCK_GM`` >= G, a power of two (rows past G
    are zeros): the reduce kernel merges one head (G = BLOCK_GM = 1), the main kernel's last slice its G heads
    at once. Reads past L1 (``.cg``): the partials were written by other programs."""
    g = tl.arange(0, BLOCK_GM)
    g_ok = g < G
    d = tl.arange(0, BLOCK_D)
    rows = row0 + g
    denom = tl.zeros([BLOCK_GM], tl.float32)
    big = denom - float("inf")
    acc = tl.zeros([BLOCK_GM, BLOCK_D], tl.float32)
    for s0 in range(0, n_slices, BLOCK_S):
        sl = s0 + tl.arange(0, BLOCK_S)
        ok = g_ok[:, None] & (sl < n_slices)[None, :]
        slot = rows[:, None] * S + sl[None, :]  # [BLOCK_GM, BLOCK_S]
        lse = tl.load(part_lse_ptr + slot, mask=ok, other=float("-inf"), cache_modifier=".cg")
        # issued beside the lse load (masked by the slice count only); rows never written are dropped below
        o = tl.load(part_out_ptr + slot[:, :, None] * D + d[None, None, :],
                    mask=ok[:, :, None] & (d < D)[None, None, :], other=0.0, cache_modifier=".cg")
        new = tl.maximum(big, tl.max(lse, axis=1))
        use = tl.where(new == float("-inf"), 0.0, new)
        rescale = tl.exp2(big - use)
        w = tl.exp2(lse - use[:, None])
        o = tl.where((lse > float("-inf"))[:, :, None], o, 0.0)
        acc = acc * rescale[:, None] + tl.sum(o * w[:, :, None], axis=1)
        denom = denom * rescale + tl.sum(w, axis=1)
        big = new
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + hq0 + g, mask=g_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        new = tl.maximum(big, sink)
        use = tl.where(new == float("-inf"), 0.0, new)
        rescale = tl.exp2(big - use)
        acc = acc * rescale[:, None]
        denom = denom * rescale + tl.exp2(sink - use)
    return acc / tl.where(denom > 0, denom, 1.0)[:, None]


@triton.jit
def _paged_decode_kernel(
    q_ptr,  # [B, Hq, D], unit stride along D
    q_seq_stride,
    q_head_stride,
    k_ptr,  # [num_blocks, PAGE, Hkv, D] key cache view (any strides but D's): q's dtype, or fp8 / int8 (KV_QUANT)
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_ptr,  # same shape as k, own strides (vLLM's are split views of one tensor)
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    k_scale_ptr,  # KV_QUANT 1: the key cache's fp32 scale; 2: [num_blocks, PAGE, Hkv] fp32 per (token, head)
    v_scale_ptr,  # the values', likewise
    scale_block_stride,  # KV_QUANT 2: the scale caches' strides (the key and value scale caches share them)
    scale_pos_stride,
    scale_head_stride,
    block_table_ptr,  # [B, max_pages] int32 physical block of each page
    block_table_stride,
    seq_lens_ptr,  # [B] int32 keys per sequence (the query is the last one)
    sinks_ptr,  # [Hq] fp32 logits, read only when HAS_SINKS
    out_ptr,  # [B, Hq, D]: written by sequences of one slice
    out_seq_stride,
    out_head_stride,
    part_out_ptr,  # [B, Hq, S, D] fp32 contiguous, written by sequences of several slices (SPLIT only)
    part_lse_ptr,  # [B, Hq, S] fp32 log2-sum-exp of each slice (-inf: a slice with no visible key)
    count_ptr,  # [B, Hkv] int32 slices counted in: zero on entry, left zero (MERGE only)
    scale,  # softmax scale (natural units)
    softcap,  # logits soft-cap; read only when HAS_SOFTCAP
    window_left,  # keys at most this far behind the query; read only when HAS_WINDOW
    split_keys,  # the fewest keys a slice takes (S_b above)
    G: tl.constexpr,  # query heads per KV head
    BLOCK_G: tl.constexpr,  # >= G and >= 16 (tl.dot's smallest M)
    D: tl.constexpr,  # head size
    BLOCK_D: tl.constexpr,  # next power of two >= D (80, 96 are masked)
    PAGE: tl.constexpr,  # KV-cache block size (tokens per page)
    BLOCK_N: tl.constexpr,  # key positions per tile
    SPLIT: tl.constexpr,  # grid S > 1: sequences may take several slices (partials + the reduce kernel)
    HAS_SINKS: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    FP32_DOT: tl.constexpr,  # see infera_vllm.triton_dot.dot
    KV_QUANT: tl.constexpr,  # 0 the caches hold q's dtype, 1 fp8 with a scale per cache, 2 a scale per (token, head)
    KV_ALIGN: tl.constexpr,  # bytes every K/V row address is a multiple of, <= 16 (16: Triton sees it itself)
    USE_PDL: tl.constexpr,  # release the reduce kernel (a programmatic dependent launch) as each program starts
    MERGE: tl.constexpr,  # SPLIT only: the last slice of each (sequence, KV head) merges them; no reduce launch
    BLOCK_GM: tl.constexpr,  # MERGE: next power of two >= G (the merge's head rows)
    BLOCK_S: tl.constexpr,  # MERGE: slices merged per step (a [BLOCK_GM, BLOCK_S, BLOCK_D] tile of partials)
):
    if USE_PDL:
        # at once: the reduce grid is launched while this one runs (its programs are placed as SMs free up after
        # this grid's last programs have started) and waits in gdc_wait for this grid's completion and writes
        gdc_launch_dependents()
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.program_id(2)
    S = tl.num_programs(2)

    seq_len = tl.load(seq_lens_ptr + b)
    start, n_slices = _slices_of(seq_len, window_left, split_keys, S, HAS_WINDOW)
    if s >= n_slices:
        return
    per_split = tl.cdiv(tl.cdiv(seq_len - start, n_slices), BLOCK_N) * BLOCK_N
    lo = start + s * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    g_ok = g < G
    d_ok = d < D
    heads = h * G + g
    q = tl.load(q_ptr + b * q_seq_stride + heads[:, None] * q_head_stride + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    qk_scale = scale * 1.4426950408889634  # exp2 domain (when soft-capped, applied after the cap)
    if HAS_SOFTCAP:
        qk_scale = scale
    if KV_QUANT == 1:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
    bt_row = block_table_ptr + b * block_table_stride
    k_head = k_ptr + h.to(tl.int64) * k_head_stride
    v_head = v_ptr + h.to(tl.int64) * v_head_stride
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        k, v, ks, vs = _paged_kv(k_head, v_head, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride, bt_row, n,
                                 n_ok, d, d_ok, k_scale_ptr, v_scale_ptr, scale_block_stride, scale_pos_stride,
                                 scale_head_stride, h, q.dtype, PAGE, KV_QUANT, KV_ALIGN)
        m, l, acc = _attend_tile(q, k, v, n_ok[None, :], m, l, acc, qk_scale, softcap, HAS_SOFTCAP, FP32_DOT, True,
                                 ks, vs, KV_QUANT == 2)
    if KV_QUANT == 1:
        acc = acc * tl.load(v_scale_ptr)

    if SPLIT and n_slices > 1:
        # a slice with no visible key: l = 0, lse = -inf, and the reduce gives it weight 0 without its output
        lse = tl.where(l > 0, m + tl.log2(tl.where(l > 0, l, 1.0)), float("-inf"))
        row = (b * (tl.num_programs(1) * G) + heads) * S + s
        tl.store(part_lse_ptr + row, lse, mask=g_ok)
        tl.store(part_out_ptr + row[:, None] * D + d[None, :], acc / tl.where(l > 0, l, 1.0)[:, None],
                 mask=g_ok[:, None] & d_ok[None, :] & (l > 0)[:, None])
        if MERGE:
            tl.debug_barrier()  # every thread's stores before the release
            count = count_ptr + b * tl.num_programs(1) + h
            if tl.atomic_add(count, 1, sem="acq_rel", scope="gpu") == n_slices - 1:  # the last slice in
                tl.debug_barrier()
                o = _merge_group(part_out_ptr, part_lse_ptr, sinks_ptr, b * (tl.num_programs(1) * G) + h * G, h * G,
                                 G, n_slices, S, D, BLOCK_GM, BLOCK_D, BLOCK_S, HAS_SINKS)
                gm = tl.arange(0, BLOCK_GM)
                tl.store(out_ptr + b * out_seq_stride + (h * G + gm)[:, None] * out_head_stride + d[None, :],
                         o.to(out_ptr.dtype.element_ty), mask=(gm < G)[:, None] & d_ok[None, :])
                tl.atomic_xchg(count, 0, sem="relaxed", scope="gpu")
    else:
        if HAS_SINKS:
            acc, l = _with_sinks(acc, l, m, sinks_ptr, heads, g_ok)
        o = acc / tl.where(l > 0, l, 1.0)[:, None]  # a sequence with no keys (padding) gets zeros
        tl.store(out_ptr + b * out_seq_stride + heads[:, None] * out_head_stride + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def _paged_decode_reduce_kernel(
    part_out_ptr,  # [B, Hq, S, D] fp32
    part_lse_ptr,  # [B, Hq, S] fp32 (log2 units)
    sinks_ptr,  # [Hq] fp32, read only when HAS_SINKS
    seq_lens_ptr,  # [B] int32, for each sequence's slice count
    out_ptr,  # [B, Hq, D]
    out_seq_stride,
    out_head_stride,
    S,  # the slice cap the main kernel ran with
    window_left,  # as the main kernel; read only when HAS_WINDOW
    split_keys,  # as the main kernel
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # slices merged per step: next power of two >= S, at most 64 (a [BLOCK_S, BLOCK_D] tile)
    HAS_SINKS: tl.constexpr,
    HAS_WINDOW: tl.constexpr,
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent: wait for the main kernel's writes
):
    """The merge (_merge_group, one head) of the S_b slices of sequences with S_b > 1 (the main kernel wrote
    the others' outputs itself), one program per (sequence, query head)."""
    b = tl.program_id(0).to(tl.int64)
    hq = tl.program_id(1)
    seq_len = tl.load(seq_lens_ptr + b)
    _, n_slices = _slices_of(seq_len, window_left, split_keys, S, HAS_WINDOW)
    if n_slices <= 1:
        return
    if USE_PDL:
        gdc_wait()
    d = tl.arange(0, BLOCK_D)
    o = _merge_group(part_out_ptr, part_lse_ptr, sinks_ptr, b * tl.num_programs(1) + hq, hq, 1, n_slices, S, D, 1,
                     BLOCK_D, BLOCK_S, HAS_SINKS)
    tl.store(out_ptr + b * out_seq_stride + hq * out_head_stride + d[None, :], o.to(out_ptr.dtype.element_ty),
             mask=(d < D)[None, :])


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
    k_ptr,  # [num_blocks, PAGE, Hkv, D]: q's dtype, or fp8 / int8 (KV_QUANT)
    k_block_stride,
    k_pos_stride,
    k_head_stride,
    v_ptr,
    v_block_stride,
    v_pos_stride,
    v_head_stride,
    k_scale_ptr,  # as the decode kernel's
    v_scale_ptr,
    scale_block_stride,
    scale_pos_stride,
    scale_head_stride,
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
    KV_QUANT: tl.constexpr,  # as the decode kernel's
    KV_ALIGN: tl.constexpr,  # as the decode kernel's
):
    """Ragged causal attention over the paged cache (module docstring, Prefill): program (p, h) takes query
    block p (across the requests, first to last) of KV head h. ``q_ptr``/``out_ptr`` [T, Hq, D] and the caches
    [num_blocks, PAGE, Hkv, D] by their strides (unit stride along D); ``block_table_ptr`` [R, pages],
    ``seq_lens_ptr`` [R] and ``query_start_loc_ptr`` [R + 1] as vLLM passes them. Switches: HAS_SINKS (a sink
    logit per query head in the denominator), HAS_SOFTCAP (cap · tanh(s / cap) on the logits), HAS_WINDOW
    (keys more than ``window_left`` behind the query masked), FP32_DOT (dots in fp32: Triton's CPU
    interpreter), UNMASKED_TILES and KV_QUANT (module docstring)."""
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
    if KV_QUANT == 1:
        qk_scale = qk_scale * tl.load(k_scale_ptr)
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
            k, v, ks, vs = _paged_kv(k_head, v_head, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride,
                                     bt_row, n, all_keys, d, d_ok, k_scale_ptr, v_scale_ptr, scale_block_stride,
                                     scale_pos_stride, scale_head_stride, h, q.dtype, PAGE, KV_QUANT, KV_ALIGN)
            m, l, acc = _attend_tile(q, k, v, all_keys[None, :], m, l, acc, qk_scale, softcap, HAS_SOFTCAP,
                                     FP32_DOT, False, ks, vs, KV_QUANT == 2)
    for n0 in range(mid, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < hi
        k, v, ks, vs = _paged_kv(k_head, v_head, k_block_stride, k_pos_stride, v_block_stride, v_pos_stride, bt_row, n,
                                 n_ok, d, d_ok, k_scale_ptr, v_scale_ptr, scale_block_stride, scale_pos_stride,
                                 scale_head_stride, h, q.dtype, PAGE, KV_QUANT, KV_ALIGN)
        visible = n_ok[None, :] & (n[None, :] <= pos[:, None])  # causal
        if HAS_WINDOW:
            visible = visible & (n[None, :] >= pos[:, None] - window_left)
        m, l, acc = _attend_tile(q, k, v, visible, m, l, acc, qk_scale, softcap, HAS_SOFTCAP, FP32_DOT, True, ks, vs,
                                 KV_QUANT == 2)
    if KV_QUANT == 1:
        acc = acc * tl.load(v_scale_ptr)

    if HAS_SINKS:
        acc, l = _with_sinks(acc, l, m, sinks_ptr, heads, row_ok)
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + q_off[:, None] * out_tok_stride + heads[:, None] * out_head_stride + d[None, :],
             o.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
