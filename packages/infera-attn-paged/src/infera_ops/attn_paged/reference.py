"""fp32 torch reference of paged decode attention (gather the pages, plain softmax); used by tests and benchmarks."""

import torch


def paged_decode_reference(q, key_cache, value_cache, block_table, seq_lens, scale, *, sinks=None, window_left=-1,
                           softcap=0.0):
    """q ``[B, Hq, D]``, caches ``[num_blocks, block_size, Hkv, D]`` -> ``[B, Hq, D]`` fp32 (see kernels.py)."""
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
        k = key_cache[blk, n % page].float()  # [N, Hkv, D]
        v = value_cache[blk, n % page].float()
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
                            window_left=-1, softcap=0.0):
    """Ragged causal attention over the cache (see kernels.py, Prefill) -> ``[T, Hq, D]`` fp32: each query token
    is a one-token decode over the keys up to its own position."""
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for r in range(seq_lens.shape[0]):
        a, b = int(query_start_loc[r]), int(query_start_loc[r + 1])
        ctx = int(seq_lens[r]) - (b - a)
        lens = torch.arange(ctx + 1, ctx + 1 + b - a, dtype=torch.int32)
        if b > a:
            out[a:b] = paged_decode_reference(q[a:b], key_cache, value_cache, block_table[r].expand(b - a, -1), lens,
                                              scale, sinks=sinks, window_left=window_left, softcap=softcap)
    return out
