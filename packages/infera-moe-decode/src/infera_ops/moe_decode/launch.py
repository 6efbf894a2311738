"""Launchers of the decode experts kernels (kernels.py) in the form the config names: split (gate/up, down,
row sum), split_sum (gate/up, down with the top-k sum inside), fused (one weight pass, row sum), persistent
(both projections in one launch, row sum) or stream (both projections and the top-k sum in one launch, each
program one pipelined pass over its chunk of each).

Capture-safe: no host synchronisation, buffers allocated on the current stream (vLLM's graph pool when
captured), grid sizes from shapes only.

``LaunchConfig``: the form, blocks and pipelining a launch takes (defaults here; the tuning file's, policy.py).

FP8 experts (``ExpertScales``): the split and split_sum forms read FP8 weights and dequantize them in the
kernel, ``W[e, n, k] * scale[e, n // group_n, k // group_k]``, against bf16/fp16 activations (no activation
quantization: each product is exact in the activations' dtype, fp32 accumulation).
"""

import copy
import functools
from typing import NamedTuple

import torch
import triton

from infera_ops.moe_decode.kernels import (
    _moe_down_kernel,
    _moe_down_sum_kernel,
    _moe_fused_kernel,
    _moe_gate_up_kernel,
    _moe_persistent_kernel,
    _moe_stream_kernel,
    _row_sum_kernel,
)
from infera_vllm import triton_dot
from infera_vllm.switches import triton_interpreter

FORMS = ("split", "fused", "persistent", "split_sum", "stream")
SCALED_FORMS = ("split", "split_sum")  # the forms that read FP8 weights


class ExpertScales(NamedTuple):
    """FP8 experts' fp32 weight scales as vLLM's FP8 MoE method keeps them. ``block`` (block_n, block_k):
    block-wise weights, ``w13`` ``[E, cdiv(2I, block_n), cdiv(H, block_k)]`` and ``w2`` ``[E, cdiv(H, block_n),
    cdiv(I, block_k)]``. ``block`` None: per tensor (``[E]``, any trailing ones), per channel (``[E, N]`` or
    ``[E, N, 1]``, N the projection's output rows), or for ``w13`` ``[E, 2]`` (gate and up halves apart)."""

    w13: torch.Tensor
    w2: torch.Tensor
    block: tuple[int, int] | None = None


def scale_grid(scale: torch.Tensor, experts: int, rows: int, cols: int, block) -> tuple:
    """``(scales, expert_stride, row_stride, col_stride, group_n, group_k)`` for the kernels' ``_group_scales``
    from one projection's scales (``rows`` x ``cols`` weights per expert); ValueError for a layout that is
    none of ``ExpertScales``'s."""
    if scale.dtype != torch.float32:
        raise ValueError(f"weight scales in {scale.dtype}: the kernels read fp32 scales")
    if block is not None:
        bn, bk = block
        want = (experts, triton.cdiv(rows, bn), triton.cdiv(cols, bk))
        if tuple(scale.shape) != want:
            raise ValueError(f"block scales {tuple(scale.shape)} for {block} blocks: expected {want}")
        return scale, scale.stride(0), scale.stride(1), scale.stride(2), bn, bk
    if scale.numel() == experts:
        flat = scale.reshape(experts)
        return flat, flat.stride(0), 0, 0, 1, 1
    flat = scale.reshape(experts, -1)
    if flat.shape[1] == rows:  # per output channel
        return flat, flat.stride(0), flat.stride(1), 0, 1, 1
    if flat.shape[1] == 2 and rows % 2 == 0:  # gate and up halves of W13 apart
        return flat, flat.stride(0), flat.stride(1), 0, rows // 2, 1
    raise ValueError(f"weight scales {tuple(scale.shape)} for {experts} experts of {rows} x {cols}: expected "
                     "per tensor, per channel, per half or block-wise")


def chunk_within(block: int, group: int, col_stride: int) -> int:
    """A reduction chunk of at most ``block`` that lies inside one scale group (``group`` elements along the
    reduction; ``col_stride`` 0: one group): the largest power of two dividing ``group``, at least 16."""
    if col_stride == 0:
        return block
    chunk = min(block, group & -group)
    if chunk < 16:
        raise ValueError(f"scale groups of {group} along the reduction: the kernels need a multiple of 16")
    return chunk


NO_SCALES = (None, 0, 0, 0, 1, 1)  # the scale arguments of an unscaled launch (the pointer is replaced)


class LaunchConfig:
    """Form, block sizes and pipelining (defaults; the per-GPU-family tuning file overrides them, see
    policy.py). ``form`` (module docstring): ``split``, ``split_sum`` or ``persistent`` (``block_i``/``block_h``
    gate/up, ``block_n``/``block_k`` down) or ``fused`` (``block_n`` is its down chunk; no ``block_k``).
    ``num_warps`` and ``num_stages`` apply to the weight-streaming kernels: at decode the depth of the load
    pipeline matters more than the arithmetic layout.
    ``min_programs``: the launcher halves ``block_i`` (not below 16) while the I-blocks of the experts in play
    give fewer programs than this, so one file fills the GPU for small and large experts alike (0: ``block_i``
    as given). ``pdl``: launch the row sum as a programmatic dependent where the GPU supports it.
    ``prefetch_down`` (split form, CUDA): the gate/up kernel prefetches the down weights into L2; (stream
    form, CUDA) each down chunk asks L2 for its W2 rows before it waits for the gate/up chunks.
    ``programs_per_sm`` (persistent and stream forms): the grid, per SM. ``early_down`` (split form, CUDA, implies
    ``pdl``): the down kernel starts with the gate/up kernel and prefetches its weights into L2 meanwhile.
    ``fill_per_sm`` (split and split_sum forms): the gate/up kernel's columns per program are cut (in steps
    of 16, at most the tile) so that the experts in play give about this many programs per SM: at M = 1 on
    Qwen3-30B-A3B dims 8 x 768 / 48 = 128 programs for 132 SMs instead of 96 (0: the tile's columns).
    ``split_i`` (split_sum form): the down kernel's programs per (token, column block), each over an equal
    share of the token's TOPK x (chunks of I) tiles, merged in the kernel by the last one in (1: none; at
    most one program per tile). The stream form takes ``block_i``, ``block_h`` (its gate/up units and
    chunks), ``block_n``, ``block_k`` (its down units and chunks), ``programs_per_sm`` and ``prefetch_down``."""

    __slots__ = ("form", "block_i", "block_h", "block_n", "block_k", "num_warps", "num_stages", "min_programs",
                 "pdl", "prefetch_down", "programs_per_sm", "early_down", "fill_per_sm", "split_i")

    def __init__(self, form="split", block_i=64, block_h=128, block_n=64, block_k=128, num_warps=4, num_stages=3,
                 min_programs=0, pdl=False, prefetch_down=False, programs_per_sm=2, early_down=False,
                 fill_per_sm=0, split_i=1):
        if form not in FORMS:
            raise ValueError(f"form {form!r}: expected one of {', '.join(FORMS)}")
        self.form, self.block_i, self.block_h, self.block_n, self.block_k = form, block_i, block_h, block_n, block_k
        self.num_warps, self.num_stages = num_warps, num_stages
        self.min_programs, self.pdl, self.prefetch_down = int(min_programs), bool(pdl), bool(prefetch_down)
        self.programs_per_sm, self.early_down = int(programs_per_sm), bool(early_down)
        self.fill_per_sm, self.split_i = int(fill_per_sm), int(split_i)
        if self.programs_per_sm < 1:
            raise ValueError(f"programs_per_sm {programs_per_sm!r}: expected >= 1")
        if self.fill_per_sm < 0:
            raise ValueError(f"fill_per_sm {fill_per_sm!r}: expected >= 0")
        if self.split_i < 1:
            raise ValueError(f"split_i {split_i!r}: expected >= 1")

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}


def block_m(tokens: int) -> int:
    """Rows of the per-expert tile: every token that chose the expert (<= M), at least 16 for tl.dot."""
    return max(16, triton.next_power_of_2(tokens))


def block_mk(pairs: int) -> int:
    """Width of the grouping comparison (>= M·TOPK). At least 128 so every decode batch up to 16 tokens of
    top-8 shares one compiled kernel (no recompilation per batch size; the comparison is 16 x 128)."""
    return max(128, triton.next_power_of_2(pairs))


SUM_BLOCK_N = 32  # the row sum reads M·R·H fp32 from L2: many small programs, few steps each
SUM_BLOCK_R = 64
MIN_BLOCK_I = 16
PREFETCH_BLOCK = 512  # 128-byte lines asked for per prefetch step (4 per thread at 4 warps)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device: torch.device) -> int:
    """The device's SM count (a CUDA device; its current one when unnumbered)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


_SYNC: dict = {}  # (device, stream) -> the persistent kernel's int32 counters, zero between launches
_OUTGROWN: list = []  # replaced counter buffers: a CUDA graph captured with one still points at it


def sync_counters(device: torch.device, entries: int) -> torch.Tensor:
    """The counters of the persistent kernel and of the split_sum merge for this device and stream (at least
    ``entries`` int32, zero): one buffer per stream, so launches on different streams never share counters;
    each launch leaves it zero. Grown (a new zeroed buffer) when a launch needs more, the old one kept alive
    for graphs that captured it; allocated on the first, eager call in vLLM (warm-up runs before CUDA-graph
    capture)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _SYNC.get(key)
    if buf is None or buf.numel() < entries:
        if buf is not None:
            _OUTGROWN.append(buf)
        buf = _SYNC[key] = torch.zeros(max(entries, 2 + 256), dtype=torch.int32, device=device)
    return buf


def ticket_programs(device: torch.device, work: int, per_sm: int) -> int:
    """The grid of a kernel whose programs take their work from a ticket counter (the persistent and stream
    forms): ``per_sm`` programs per SM, at most one per unit of ``work``. Under Triton's interpreter, which
    runs programs one after another, ``per_sm`` of them: the first takes every ticket, the others find none
    and leave, and the last one out zeroes the counters, as on a GPU."""
    if device.type != "cuda" or triton_interpreter():
        return max(1, min(work, per_sm))
    return max(1, min(work, _sms(device) * per_sm))


def block_i_for(cfg: LaunchConfig, experts_in_play: int, inter: int) -> int:
    """``cfg.block_i``, halved (not below 16) while ``experts_in_play`` x I-blocks < ``cfg.min_programs``."""
    block = cfg.block_i
    while block > MIN_BLOCK_I and experts_in_play * triton.cdiv(inter, block) < cfg.min_programs:
        block //= 2
    return block


def gate_up_cols(cfg: LaunchConfig, block: int, experts_in_play: int, inter: int, device: torch.device) -> int:
    """Columns of I per gate/up program: ``block`` (the tile), or with ``cfg.fill_per_sm`` the fewest
    multiple of 16 that keeps the programs of the experts in play at about ``fill_per_sm`` per SM (8 "SMs"
    off CUDA, so that the interpreter runs the same rule)."""
    if not cfg.fill_per_sm:
        return block
    sms = _sms(device) if device.type == "cuda" else 8
    cols = triton.cdiv(triton.cdiv(experts_in_play * inter, cfg.fill_per_sm * sms), 16) * 16
    return max(16, min(block, cols))


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, out: torch.Tensor | None = None, config: LaunchConfig | None = None,
                expert_map: torch.Tensor | None = None, scales: ExpertScales | None = None) -> torch.Tensor:
    """``out[M, H] = sum_k topk_weights[:, k] * W2[e] @ silu_and_mul(W13[e] @ x)`` (see kernels.py).

    x ``[M, H]``; w13 ``[E, 2I, H]``; w2 ``[E, H, I]`` (unit stride on their last dims); topk_* ``[M, TOPK]``.
    ``expert_map`` (expert parallel, vLLM's): global expert id -> index into this rank's w13/w2, -1 for an
    expert held elsewhere, which then contributes nothing. ``scales``: FP8 weights' scales (``ExpertScales``;
    the split and split_sum forms), the activation ``a`` kept in x's dtype.
    """
    cfg = config or LaunchConfig()
    M, H = x.shape
    E, two_i, _ = w13.shape
    s13 = s2 = NO_SCALES
    if scales is not None:
        if cfg.form not in SCALED_FORMS:
            raise ValueError(f"form {cfg.form!r} reads no scaled weights: use one of {', '.join(SCALED_FORMS)}")
        s13 = scale_grid(scales.w13, E, two_i, H, scales.block)
        s2 = scale_grid(scales.w2, E, H, two_i // 2, scales.block)
        cfg = copy.copy(cfg)
        cfg.block_h = chunk_within(cfg.block_h, s13[5], s13[3])
        cfg.block_k = chunk_within(cfg.block_k, s2[5], s2[3])
    elif w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"{w13.dtype} / {w2.dtype} weights for {x.dtype} activations need their scales")
    inter = two_i // 2
    topk = topk_ids.shape[1]
    mk = M * topk
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1 or (out is not None and out.stride(-1) != 1):
        raise ValueError("x, w13, w2 and out need unit stride on their last dimension")
    if out is None:
        out = torch.empty(M, H, dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    ids = topk_ids if expert_map is None else expert_map[topk_ids.long()]
    ids = ids if ids.is_contiguous() else ids.contiguous()
    weights = topk_weights if topk_weights.is_contiguous() else topk_weights.contiguous()
    bm, bmk = block_m(M), block_mk(mk)
    fp32_dot = triton_dot.fp32_dot()
    early_down = cfg.early_down and cfg.form == "split" and x.device.type == "cuda" and not fp32_dot
    use_pdl = (cfg.pdl or early_down) and triton_dot.pdl_supported(x.device)
    early_down = early_down and use_pdl
    pdl_kw = {"launch_pdl": True} if use_pdl else {}
    blk_i = block_i_for(cfg, min(mk, E), inter)
    if cfg.form == "stream":
        act = torch.empty(mk, inter, dtype=x.dtype, device=x.device)
        units = max(mk * triton.cdiv(inter, cfg.block_i), M * triton.cdiv(H, cfg.block_n))
        prefetch = cfg.prefetch_down and x.device.type == "cuda" and not fp32_dot
        _moe_stream_kernel[(ticket_programs(x.device, units, cfg.programs_per_sm),)](
            x, x.stride(0), w13, w13.stride(0), w13.stride(1), w2, w2.stride(0), w2.stride(1), ids, weights,
            act, act.stride(0), out, out.stride(0), sync_counters(x.device, 3), M, H, inter, topk,
            BLOCK_MK=triton.next_power_of_2(mk), BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, FP32_DOT=fp32_dot, PREFETCH_DOWN=prefetch, PREFETCH_BLOCK=PREFETCH_BLOCK,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        return out  # the kernel wrote the sums: no row-sum launch
    if cfg.form == "fused":
        n_blocks = triton.cdiv(inter, blk_i)
        rows = torch.empty(mk, n_blocks, H, dtype=torch.float32, device=x.device)
        _moe_fused_kernel[(mk, n_blocks)](
            x, x.stride(0), w13, w13.stride(0), w13.stride(1), w2, w2.stride(0), w2.stride(1), ids, weights, rows,
            mk, H, inter, topk, BLOCK_MK=bmk, BLOCK_M=bm, BLOCK_I=blk_i, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
            FP32_DOT=fp32_dot, USE_PDL=use_pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        per_token = topk * n_blocks
    elif cfg.form == "persistent":
        act = torch.empty(mk, inter, dtype=x.dtype, device=x.device)
        rows = torch.empty(mk, H, dtype=torch.float32, device=x.device)
        sync = sync_counters(x.device, 2 + mk)
        items = mk * (triton.cdiv(inter, blk_i) + triton.cdiv(H, cfg.block_n))
        _moe_persistent_kernel[(ticket_programs(x.device, items, cfg.programs_per_sm),)](
            x, x.stride(0), w13, w13.stride(0), w13.stride(1), w2, w2.stride(0), w2.stride(1), ids, weights,
            act, act.stride(0), rows, sync, mk, H, inter, topk, BLOCK_MK=bmk, BLOCK_M=bm, BLOCK_I=blk_i,
            BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FP32_DOT=fp32_dot, USE_PDL=use_pdl,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        per_token = topk
    else:  # split and split_sum: the same gate/up kernel
        act = torch.empty(mk, inter, dtype=x.dtype, device=x.device)
        prefetch = (cfg.prefetch_down and cfg.form == "split" and x.device.type == "cuda" and not fp32_dot
                    and w2.is_contiguous())
        cols = gate_up_cols(cfg, blk_i, min(mk, E), inter, x.device)
        _moe_gate_up_kernel[(mk, triton.cdiv(inter, cols))](
            x, x.stride(0), w13, w13.stride(0), w13.stride(1), ids, act, act.stride(0),
            mk, H, inter, topk, cols, w2, s13[0] if scales is not None else x, *s13[1:], BLOCK_MK=bmk, BLOCK_M=bm,
            BLOCK_I=blk_i, BLOCK_H=cfg.block_h, FP32_DOT=fp32_dot, PREFETCH_DOWN=prefetch,
            PREFETCH_BLOCK=PREFETCH_BLOCK, USE_PDL=use_pdl, EARLY_DOWN=early_down, W_SCALED=scales is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        s2_args = (s2[0] if scales is not None else x, *s2[1:])
        if cfg.form == "split_sum":
            n_blocks, items = triton.cdiv(H, cfg.block_n), topk * triton.cdiv(inter, cfg.block_k)
            per_share = triton.cdiv(items, min(cfg.split_i, items))  # (slot, chunk of I) tiles per program
            shares = triton.cdiv(items, per_share)  # no share without items
            if shares > 1:
                part = torch.empty(M, shares, H, dtype=torch.float32, device=x.device)
                count = sync_counters(x.device, M * n_blocks)
            else:
                part, count = out, ids  # not read: no merge
            _moe_down_sum_kernel[(M, n_blocks, shares)](
                act, act.stride(0), w2, w2.stride(0), w2.stride(1), ids, weights, out, out.stride(0), part, count,
                H, inter, topk, per_share, *s2_args, BLOCK_T=triton.next_power_of_2(topk), BLOCK_N=cfg.block_n,
                BLOCK_K=cfg.block_k, SPLIT_I=shares, FP32_DOT=fp32_dot, USE_PDL=use_pdl,
                W_SCALED=scales is not None, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kw)
            return out  # the down kernel wrote the sums: no row-sum launch
        rows = torch.empty(mk, H, dtype=torch.float32, device=x.device)
        _moe_down_kernel[(mk, triton.cdiv(H, cfg.block_n))](
            act, act.stride(0), w2, w2.stride(0), w2.stride(1), ids, weights, rows,
            mk, H, inter, *s2_args, BLOCK_MK=bmk, BLOCK_M=bm, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            FP32_DOT=fp32_dot, USE_PDL=use_pdl, EARLY_DOWN=early_down, W_SCALED=scales is not None,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kw)
        per_token = topk
    _row_sum_kernel[(M, triton.cdiv(H, SUM_BLOCK_N))](
        rows, out, out.stride(0), H, per_token, BLOCK_R=SUM_BLOCK_R, BLOCK_N=SUM_BLOCK_N, USE_PDL=use_pdl, **pdl_kw)
    return out
