"""fp32 torch references of paged attention, decode and ragged prefill (gather the pages, plain softmax); used by
tests and benchmarks."""

import contextlib

import torch


def paged_decode_reference(q, key_cache, value_cache, block_table, seq_lens, scale, *, sinks=None, window_left=-1,
                           softcap=0.0, kv_scales=None):
    """q ``[B, Hq, D]``, caches ``[num_blocks, block_size, Hkv, D]`` -> ``[B, Hq, D]`` fp32 (see kernels.py);
    ``kv_scales`` (launch.KVScales) where the caches are quantized."""
    B, Hq, D = q.shape
    page, Hkv = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros(B, Hq, D, dtype=torch.float32, device=q.device)
    for b in range(B):
        L = int(seq_lens[b])
        lo = max(0, L - 1 - window_left) if window_left >= 0 else 0
        if L == 0:
            continue
        n = torch.arange(lo, L, device=q.device)
        blk = block_table[b, n // page].long()
        k, v = gathered(key_cache, value_cache, blk, n % page, kv_scales)  # [N, Hkv, D]
        k = k.repeat_interleave(Hq // Hkv, dim=1)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if sinks is not None:
            s = torch.cat([s, sinks.float()[:, None]], dim=1)
        p = s.softmax(dim=-1)[:, : n.numel()]
        out[b] = torch.einsum("hn,nhd->hd", p, v)
    return out


def paged_prefill_reference(q, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, *, sinks=None,
                            window_left=-1, softcap=0.0, kv_scales=None):
    """Ragged causal attention over the cache (see kernels.py, Prefill) -> ``[T, Hq, D]`` fp32: each query token
    is a one-token decode over the keys up to its own position."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for r in range(seq_lens.shape[0]):
        a, b = int(query_start_loc[r]), int(query_start_loc[r + 1])
        ctx = int(seq_lens[r]) - (b - a)
        lens = torch.arange(ctx + 1, ctx + 1 + b - a, dtype=torch.int32)
        if b > a:
            out[a:b] = paged_decode_reference(q[a:b], key_cache, value_cache, block_table[r].expand(b - a, -1), lens,
                                              scale, sinks=sinks, window_left=window_left, softcap=softcap,
                                              kv_scales=kv_scales)
    return out


def gathered(key_cache, value_cache, blk, pos, kv_scales=None):
    """fp32 keys and values ``[N, Hkv, D]`` of the slots (blk, pos), dequantized where the caches are
    quantized: x = scale · x_q with one scale per cache or per (token, head) (launch.KVScales)."""
    k, v = key_cache[blk, pos].float(), value_cache[blk, pos].float()
    if kv_scales is None or kv_scales.mode == 0:
        return k, v
    if kv_scales.mode == 2:  # scale caches [num_blocks, block_size, Hkv]: one scale per head row
        return k * kv_scales.k[blk, pos].float()[..., None], v * kv_scales.v[blk, pos].float()[..., None]
    return k * kv_scales.k.float().reshape(()), v * kv_scales.v.float().reshape(())


def quantize_per_tensor(x, scale, dtype):
    """x / scale in the fp8 ``dtype``, saturated to its range: what vLLM's KV write stores in a per-tensor fp8
    cache (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``)."""
    big = torch.finfo(dtype).max
    return (x.float() / scale.float()).clamp(-big, big).to(dtype)


def quantize_per_token_head(x, dtype):
    """(x_q, scales) for x ``[..., D]``: one fp32 scale per row, max(absmax / QMAX, 1e-6), x_q = x / scale
    rounded half away from zero (int8) or converted (fp8), clamped to the dtype's range: TRITON_ATTN's
    per-token-head write (``int8_per_token_head``, ``fp8_per_token_head``)."""
    info = torch.iinfo(dtype) if not dtype.is_floating_point else torch.finfo(dtype)
    x = x.float()
    scales = (x.abs().amax(dim=-1) / float(info.max)).clamp(min=1e-6)
    q = x / scales[..., None]
    if not dtype.is_floating_point:
        q = torch.where(q >= 0, q + 0.5, q - 0.5).trunc()
    return q.clamp(float(info.min), float(info.max)).to(dtype), scales


@contextlib.contextmanager
def fp32_matmuls():
    """True fp32 matmuls (no TF32) for the reference, whatever an import set."""
    prev = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(prev)


def paged_prefill_reference_fast(q, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, *,
                                 shift: int = 0, causal: bool = True) -> torch.Tensor:
    """fp32 ragged causal attention -> [T, Hq, D]: each request's keys and values gathered once through its
    block table, then per KV head one [G·q, L] logit matmul with the causal mask (token i of a request with
    c cached tokens sees keys 0 .. c + i) and one PV matmul. The same maths as
    ``paged_prefill_reference``, fast enough for the benchmark's sizes. ``shift`` / ``causal=False``: wrong masks
    for the tests' negative checks (each token sees ``shift`` keys more; every key)."""
    T, Hq, D = q.shape
    page, Hkv = key_cache.shape[1], key_cache.shape[2]
    G = Hq // Hkv
    out = torch.zeros(T, Hq, D, dtype=torch.float32, device=q.device)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    with fp32_matmuls():
        for r, L in enumerate(lens):
            a, b = starts[r], starts[r + 1]
            if b == a or L == 0:
                continue
            n = torch.arange(L, device=q.device)
            blk = block_table[r, n // page].long()
            k = key_cache[blk, n % page].float()  # [L, Hkv, D]
            v = value_cache[blk, n % page].float()
            pos = (L - (b - a)) + torch.arange(b - a, device=q.device)  # absolute position of each query token
            hidden = n[None, :] > pos[:, None] + shift if causal else torch.zeros(1, L, dtype=torch.bool,
                                                                                   device=q.device)
            qr = q[a:b].float().view(b - a, Hkv, G, D)
            for h in range(Hkv):
                s = torch.einsum("tgd,nd->gtn", qr[:, h], k[:, h]) * scale  # [G, q, L]
                s.masked_fill_(hidden, float("-inf"))
                out[a:b, h * G:(h + 1) * G] = torch.einsum("gtn,nd->tgd", s.softmax(dim=-1), v[:, h])
    return out
