"""fp32 torch references of paged attention, decode and ragged prefill (gather the pages, plain softmax); used by
tests and benchmarks."""

import contextlib

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
