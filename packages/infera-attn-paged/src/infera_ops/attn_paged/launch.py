"""Launchers of the paged decode and ragged prefill kernels (kernels.py): split choice,
launch sizes, the fp32 workspace.

Capture-safe: no host synchronisation, no allocation when a :class:`Workspace` is passed (vLLM's metadata
builder owns one per device), grid sizes from shapes and the batch size only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from infera_ops.attn_paged import policy
from infera_ops.attn_paged.kernels import _paged_decode_kernel, _paged_decode_reduce_kernel, _paged_prefill_kernel
from infera_vllm import triton_dot
from infera_vllm.triton_dot import pdl_supported

MAX_SPLITS = 256  # the most slices any policy may ask for (SplitPolicy.max_splits picks within it)
REDUCE_BLOCK_S = 64  # slices the reduce kernel merges per step
# the in-kernel merge's step: G heads x BLOCK_S slices x D of fp32 partials at most this many elements (32
# registers per thread at 4 warps, after the slice loop's registers are free)
MERGE_TILE = 4096


# kernels.py's KV_QUANT: how the caches hold keys and values
KV_PLAIN, KV_PER_TENSOR, KV_PER_TOKEN_HEAD = 0, 1, 2
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


@dataclass(frozen=True)
class KVScales:
    """The scales of a quantized KV cache (kernels.py, Quantized KV caches). ``mode`` KV_PER_TENSOR: fp8
    caches, ``k`` and ``v`` one fp32 value each (vLLM's ``layer._k_scale`` / ``_v_scale``, on the device: read
    by the kernel, so a CUDA graph replays with whatever they hold). KV_PER_TOKEN_HEAD: int8 or fp8 caches,
    ``k`` and ``v`` the fp32 scale caches ``[num_blocks, block_size, Hkv]`` (TRITON_ATTN's strided views into
    its cache pages; the two share strides)."""

    mode: int
    k: torch.Tensor
    v: torch.Tensor


def _scale_args(scales: KVScales | None, key_cache: torch.Tensor, q: torch.Tensor) -> tuple:
    """(k_scale, v_scale, block, position and head strides of the scale caches, KV_QUANT) for a launch; a
    clear error where the caches and the scales do not go together."""
    if scales is None or scales.mode == KV_PLAIN:
        if key_cache.dtype != q.dtype:
            raise ValueError(f"a {key_cache.dtype} cache with {q.dtype} queries needs its KVScales")
        return q, q, 0, 0, 0, KV_PLAIN
    k, v = scales.k, scales.v
    if k.dtype != torch.float32 or v.dtype != torch.float32:
        raise ValueError(f"KV scales must be fp32, not {k.dtype} / {v.dtype}")
    if scales.mode == KV_PER_TENSOR:
        if key_cache.dtype not in FP8_DTYPES or k.numel() != 1 or v.numel() != 1:
            raise ValueError(f"per-tensor scales take fp8 caches and one scale each, not {key_cache.dtype} with "
                             f"{k.numel()} / {v.numel()} scales")
        return k, v, 0, 0, 0, KV_PER_TENSOR
    if scales.mode != KV_PER_TOKEN_HEAD:
        raise ValueError(f"unknown KV quantization mode {scales.mode}")
    shape = (key_cache.shape[0], key_cache.shape[1], key_cache.shape[2])
    if key_cache.dtype not in (torch.int8, *FP8_DTYPES) or k.shape != shape or v.shape != shape \
            or k.stride() != v.stride():
        raise ValueError(f"per-token-head scales take int8 / fp8 caches and two scale caches {shape} of one "
                         f"layout, not {key_cache.dtype} with {tuple(k.shape)} / {tuple(v.shape)}")
    return k, v, *k.stride(), KV_PER_TOKEN_HEAD


def kv_alignment(key_cache: torch.Tensor, value_cache: torch.Tensor) -> int:
    """kernels.py's KV_ALIGN: the largest power of two up to 16 that every key and value row's byte address
    is a multiple of (the caches' base addresses and block, position and head strides in bytes). A quantized
    cache with per-(token, head) scales keeps each scale inline after its row (TRITON_ATTN's layout, rows of
    D + 4 bytes), so its rows sit 4 bytes apart from 16-byte alignment; told so, the kernels load 4 bytes at
    a time instead of one."""
    align = 16
    for cache in (key_cache, value_cache):
        for value in (cache.data_ptr(), *(stride * cache.element_size() for stride in cache.stride()[:3])):
            while value % align:
                align //= 2
    return align


@dataclass(frozen=True)
class LaunchConfig:
    block_n: int = 64  # key positions per tile
    num_warps: int = 4
    num_stages: int = 2
    reduce_warps: int = 4  # the split reduce kernel's (decode)
    # decode launches whose slice cap is 1 (batches that fill the GPU one program per sequence and KV head)
    # take these sizes instead, where set: each program then walks a whole sequence, and the tile that streams
    # a long walk best is not the one that suits many short slices
    unsplit: LaunchConfig | None = None
    # per query heads per KV head G, the unsplit launch for that group (None: the sizes above); groups not
    # listed take ``unsplit``. A program's tile is G query rows x BLOCK_N keys: G sets its arithmetic per
    # byte and its registers, so the tile that streams best differs between groups of one head size
    unsplit_by_group: tuple[tuple[int, LaunchConfig | None], ...] = ()

    def for_slices(self, splits: int, group: int) -> LaunchConfig:
        """The sizes a decode launch with slice cap ``splits`` uses for query groups of ``group`` heads."""
        if splits > 1:
            return self
        for g, cfg in self.unsplit_by_group:
            if g == group:
                return cfg or self
        return self.unsplit or self


@dataclass(frozen=True)
class SplitPolicy:
    """How the decode kernel cuts sequences into slices (kernels.py): the slice cap S fills about
    ``programs_per_sm`` programs per SM over the batch's (sequence, KV head) pairs, and each sequence takes
    ceil(keys / ``split_keys``) slices up to S, on the device. Enough programs in flight per SM is what keeps
    HBM busy in decode (each program has only its pipeline's few tiles of loads outstanding); a slice must
    still hold enough keys that its fixed cost (query load, partial write, its share of the merge) stays
    small. The defaults serve families without a tuning file."""

    programs_per_sm: int = 16
    split_keys: int = 128
    max_splits: int = 64  # the slice cap's ceiling (at most MAX_SPLITS): more slices, more programs at batch 1
    # where the slice cap is at most this, the last slice of each (sequence, KV head) merges the slices in the
    # main kernel: no reduce launch (and no PDL), a merge of S_b / BLOCK_S dependent L2 reads in that program
    # after its own slice instead (kernels.py, MERGE); 0: the reduce kernel merges at every cap
    merge_max_slices: int = 0
    # registers per thread the merging kernel is compiled to at most (Triton's ``maxnreg``; CUDA only), 0: the
    # compiler's choice. The merge's live values can push the kernel past what programs_per_sm programs per SM
    # need (sm90, hd128, Triton 3.6: 138 against 112 without the merge, so 3 programs per SM instead of 4);
    # a cap spills a few values instead (8 bytes there), see register_budget
    merge_max_registers: int = 0


def register_budget(programs_per_sm: int, num_warps: int) -> int:
    """Registers per thread that let ``programs_per_sm`` programs of ``num_warps`` warps share an SM's 64K
    (NVIDIA; allocated in steps of 8 per thread, at most 255)."""
    return min(255, 65536 // (programs_per_sm * num_warps * 32) // 8 * 8)


# Launch sizes for a GPU family without a tuning file (policy.py; sm90 has one, measured): small tiles that
# compile without spills on sm90, gfx942, gfx950 and gfx1201 up to D = 128; the RDNA families' tuning files
# replace what spills there (tests/test_attn_paged_compile.py compiles every family's).
def launch_config(head_size: int) -> LaunchConfig:
    if head_size <= 64:
        return LaunchConfig(block_n=64, num_warps=4, num_stages=2)
    return LaunchConfig(block_n=32, num_warps=4, num_stages=2)  # 80 / 96 / 128 (padded to 128) and 256


SPLIT_POLICY = SplitPolicy()


def decode_defaults(head_size: int, device) -> tuple[LaunchConfig, SplitPolicy, bool]:
    """(launch config, split policy, PDL) for the decode kernel on this device: the family's tuning file
    (policy.py) where it has one, else launch_config, SPLIT_POLICY and PDL where supported."""
    tuned = policy.decode_settings(head_size, device)
    if tuned is None:
        return launch_config(head_size), SPLIT_POLICY, pdl_supported(device)
    unsplit = LaunchConfig(*tuned.unsplit) if tuned.unsplit else None
    by_group = tuple((g, LaunchConfig(*launch) if launch else None) for g, launch in tuned.unsplit_by_group)
    return (LaunchConfig(tuned.block_n, tuned.num_warps, tuned.num_stages, tuned.reduce_warps, unsplit, by_group),
            SplitPolicy(tuned.programs_per_sm, tuned.split_keys, tuned.max_splits, tuned.merge_max_slices,
                        tuned.merge_max_registers),
            tuned.pdl and pdl_supported(device))


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 8


def split_cap(batch: int, num_kv_heads: int, device: torch.device, policy: SplitPolicy | None = None,
              head_size: int | None = None) -> int:
    """The slice cap S for a batch size: programs_per_sm x SMs programs over batch x KV heads, in
    [1, policy.max_splits] (at most MAX_SPLITS). Depends on the batch size and head count only, never on
    context lengths, so a CUDA graph captured for one batch size replays with any lengths (each sequence's
    slice count is chosen on the device from its length, see kernels.py). Policy: the given one, else the
    device's for ``head_size`` (or SPLIT_POLICY without one)."""
    if policy is None:
        policy = decode_defaults(head_size, device)[1] if head_size else SPLIT_POLICY
    ceiling = min(MAX_SPLITS, policy.max_splits)
    return max(1, min(ceiling, policy.programs_per_sm * _sm_count(device) // (batch * num_kv_heads)))


def slices_per_sequence(seq_lens: torch.Tensor, cap: int, *, window_left: int = -1,
                        policy: SplitPolicy | None = None) -> torch.Tensor:
    """The slice count the kernel gives each sequence (kernels.py's S_b), computed in torch: for tests and
    benchmarks; the kernels compute it themselves."""
    policy = policy or SPLIT_POLICY
    span = seq_lens.long() if window_left < 0 else torch.clamp(seq_lens.long(), max=window_left + 1)
    return torch.clamp((span + policy.split_keys - 1) // policy.split_keys, min=1, max=cap)


class Workspace:
    """fp32 partial outputs and log-sum-exps for up to ``max_rows`` (sequence, slice) pairs, reused by every
    layer: a decode batch of B sequences under a slice cap S needs B·S rows; and the in-kernel merge's
    counters (one per sequence and KV head: fewer than the rows' heads), zero between launches."""

    def __init__(self, max_rows: int, num_heads: int, head_size: int, device, max_splits: int = MAX_SPLITS):
        self.max_rows, self.num_heads, self.head_size, self.max_splits = max_rows, num_heads, head_size, max_splits
        self.out = torch.empty(max_rows * num_heads * head_size, dtype=torch.float32, device=device)
        self.lse = torch.empty(max_rows * num_heads, dtype=torch.float32, device=device)
        self.count = torch.zeros(max_rows * num_heads, dtype=torch.int32, device=device)

    def fits(self, batch: int, num_heads: int, head_size: int, splits: int) -> bool:
        return batch * splits * num_heads * head_size <= self.out.numel() and splits <= self.max_splits


def _check(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int]:
    """(block size, KV heads) of caches that match q; a clear error otherwise."""
    _, page, Hkv, D = key_cache.shape
    if q.shape[-1] != D or value_cache.shape != key_cache.shape or q.shape[1] % Hkv:
        raise ValueError(f"q {tuple(q.shape)} does not match the caches {tuple(key_cache.shape)}")
    if q.stride(-1) != 1 or key_cache.stride(-1) != 1 or value_cache.stride(-1) != 1:
        raise ValueError("q and the caches need unit stride along the head dimension")
    return page, Hkv


def paged_decode(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor, scale: float, out: torch.Tensor | None = None, *,
                 sinks: torch.Tensor | None = None, window_left: int = -1, softcap: float = 0.0,
                 num_splits: int | None = None, workspace: Workspace | None = None,
                 config: LaunchConfig | None = None, policy: SplitPolicy | None = None,
                 pdl: bool | None = None, kv_scales: KVScales | None = None) -> torch.Tensor:
    """Attention of one query token per sequence over its paged keys and values (see kernels.py).

    q ``[B, Hq, D]``; key_cache / value_cache ``[num_blocks, block_size, Hkv, D]`` (vLLM's views; unit stride
    along D); block_table ``[B, pages]`` and seq_lens ``[B]`` int32; sinks ``[Hq]`` logits or None;
    window_left >= 0 keeps keys at most that far behind the query (vLLM's ``sliding_window - 1``), -1 all;
    softcap > 0 caps the logits. ``num_splits`` is the slice cap S (default :func:`split_cap`); each
    sequence takes up to S slices by its length under ``policy``; ``config`` the launch sizes (its
    unsplit sizes for the query group where S = 1, :meth:`LaunchConfig.for_slices`); ``pdl``
    whether the reduce is a programmatic dependent launch (only where :func:`pdl_supported`; none when the
    policy merges in the kernel at this cap, ``SplitPolicy.merge_max_slices``, compiled to at most
    ``merge_max_registers`` registers where set); each defaults
    to :func:`decode_defaults` for the head size and device. A policy with split_keys = 1 makes every
    sequence take exactly S slices, as long as it has S keys. ``kv_scales``: the caches' scales where they
    are quantized (:class:`KVScales`; queries stay in their dtype). Writes and returns ``out`` ``[B, Hq, D]``.
    """
    B, Hq, D = q.shape
    page, Hkv = _check(q, key_cache, value_cache)
    *scale_args, kv_quant = _scale_args(kv_scales, key_cache, q)
    if out is None:
        out = torch.empty_like(q)
    if B == 0:
        return out
    tuned_cfg, tuned_policy, tuned_pdl = decode_defaults(D, q.device)
    cfg, policy = config or tuned_cfg, policy or tuned_policy
    splits = num_splits or split_cap(B, Hkv, q.device, policy)
    G = Hq // Hkv
    cfg = cfg.for_slices(splits, G)
    merge = 1 < splits <= policy.merge_max_slices
    use_pdl = (tuned_pdl if pdl is None else pdl and pdl_supported(q.device)) and not merge
    capped = ({"maxnreg": policy.merge_max_registers}
              if merge and policy.merge_max_registers and q.device.type == "cuda" and not torch.version.hip else {})
    common = dict(G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BLOCK_D=triton.next_power_of_2(D),
                  PAGE=page, BLOCK_N=cfg.block_n, HAS_SINKS=sinks is not None, HAS_SOFTCAP=softcap > 0,
                  HAS_WINDOW=window_left >= 0, FP32_DOT=triton_dot.fp32_dot())
    if splits > 1:
        if workspace is None:
            workspace = Workspace(B * splits, Hq, D, q.device, max_splits=splits)
        if not workspace.fits(B, Hq, D, splits):
            raise ValueError(f"workspace too small for batch {B} x {Hq} heads x {splits} splits")
        part_out, part_lse, count = workspace.out, workspace.lse, workspace.count
    else:
        part_out = part_lse = count = out  # not read: SPLIT is off
    block_s = min(REDUCE_BLOCK_S, triton.next_power_of_2(splits))
    block_gm = triton.next_power_of_2(G)
    merge_block_s = merge_step(block_gm, common["BLOCK_D"], splits)
    _paged_decode_kernel[(B, Hkv, splits)](
        q, q.stride(0), q.stride(1),
        key_cache, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache, value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), *scale_args,
        block_table, block_table.stride(0), seq_lens, sinks if sinks is not None else q,
        out, out.stride(0), out.stride(1), part_out, part_lse, count,
        float(scale), float(softcap), int(window_left), int(policy.split_keys), KV_QUANT=kv_quant,
        KV_ALIGN=kv_alignment(key_cache, value_cache),
        SPLIT=splits > 1, USE_PDL=use_pdl and splits > 1, MERGE=merge, BLOCK_GM=block_gm, BLOCK_S=merge_block_s,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **capped, **common)
    if splits > 1 and not merge:
        pdl_kw = {"launch_pdl": True} if use_pdl else {}
        _paged_decode_reduce_kernel[(B, Hq)](
            part_out, part_lse, sinks if sinks is not None else q, seq_lens, out, out.stride(0), out.stride(1),
            splits, int(window_left), int(policy.split_keys),
            D=D, BLOCK_D=common["BLOCK_D"], BLOCK_S=block_s,
            HAS_SINKS=sinks is not None, HAS_WINDOW=window_left >= 0, USE_PDL=use_pdl, num_warps=cfg.reduce_warps,
            **pdl_kw)
    return out


def merge_step(block_gm: int, block_d: int, splits: int) -> int:
    """Slices per step of the in-kernel merge (kernels.py ``_merge_group``): every slice of the cap at once
    where a [block_gm, slices, block_d] fp32 tile fits MERGE_TILE, else the largest power of two that does."""
    fit = max(1, MERGE_TILE // (block_gm * block_d))
    return min(triton.next_power_of_2(splits), 1 << (fit.bit_length() - 1))


def prefill_config(head_size: int, group: int, device=None, kv_quant: int = KV_PLAIN) -> tuple[int, LaunchConfig]:
    """(BLOCK_M rows = query tokens x heads of a group, launch config) for the ragged kernel: the device's
    family's tuning file where it has prefill settings for the head size (policy.py), else the defaults.
    Those are without spills on sm90 (as launch_config): up to D = 128, 128 rows x 64-key tiles on 8 warps
    (212 registers; 64 rows on 4 warps spilled 844 bytes); at D = 256, 32 rows x 16-key tiles on 4 warps
    (200-232). ``kv_quant``: the cache's KV_QUANT; per (token, head) the sizes of
    :func:`per_token_head_prefill`."""
    tuned = policy.prefill_settings(head_size, device) if device is not None else None
    if tuned is not None:
        block_m, config = (max(tuned.block_m, triton.next_power_of_2(group)),
                           LaunchConfig(block_n=tuned.block_n, num_warps=tuned.num_warps, num_stages=tuned.num_stages))
    elif head_size <= 128:
        block_m, config = max(128, triton.next_power_of_2(group)), LaunchConfig(block_n=64, num_warps=8, num_stages=2)
    else:
        block_m, config = max(32, triton.next_power_of_2(group)), LaunchConfig(block_n=16, num_warps=4, num_stages=2)
    if kv_quant == KV_PER_TOKEN_HEAD:
        return block_m, per_token_head_prefill(block_m, config)
    return block_m, config


def per_token_head_prefill(block_m: int, config: LaunchConfig) -> LaunchConfig:
    """The prefill launch over a per-(token, head) cache for the plain cache's ``block_m`` rows and
    ``config``: at least 8 warps, and at most 4096 // block_m keys per tile. Its tile holds the int8/fp8
    keys and values, their bf16 conversion and the inline scale vectors beside the plain tile's state: on
    sm90 under Triton 3.6 (the H200's) the D = 128 launches spill at the plain sizes (64 rows x 64 keys on
    4 warps: 255 registers + 64 bytes; 128 x 64 on 8: 255 + 80) and fit this way (231; 128 x 32 on 8: 244;
    tests/test_attn_paged_compile.py). Chosen to fit, not tuned for speed."""
    return LaunchConfig(block_n=max(16, min(config.block_n, 4096 // block_m)), num_warps=max(8, config.num_warps),
                        num_stages=config.num_stages)


def prefill_constexprs(group: int, head_size: int, page: int, block_m: int, config: LaunchConfig, *,
                       sinks: bool = False, softcap: bool = False, window: bool = False, cuda: bool = True,
                       kv_quant: int = KV_PLAIN, kv_align: int = 16) -> dict:
    """The ragged prefill kernel's compile-time arguments for a launch of ``block_m`` rows (``group`` query
    heads per KV head, so ``block_m // group`` query positions) and ``config``'s key tile: what
    :func:`paged_prefill` passes, and what a tuner or compile check compiles ahead of time. ``cuda``: the
    tiles before a program's first query position run without the causal mask (``UNMASKED_TILES``; on
    ROCm every tile keeps it). ``kv_quant``, ``kv_align``: the caches' KV_QUANT and KV_ALIGN (kernels.py,
    :func:`kv_alignment`)."""
    return dict(G=group, BLOCK_M=block_m, BLOCK_Q=block_m // group, D=head_size,
                BLOCK_D=triton.next_power_of_2(head_size), PAGE=page, BLOCK_N=config.block_n, HAS_SINKS=sinks,
                HAS_SOFTCAP=softcap, HAS_WINDOW=window, FP32_DOT=triton_dot.fp32_dot(), UNMASKED_TILES=cuda,
                KV_QUANT=kv_quant, KV_ALIGN=kv_align)


def paged_prefill(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor, query_start_loc: torch.Tensor, scale: float, out: torch.Tensor | None = None,
                  *, sinks: torch.Tensor | None = None, window_left: int = -1, softcap: float = 0.0,
                  block_m: int | None = None, config: LaunchConfig | None = None,
                  kv_scales: KVScales | None = None) -> torch.Tensor:
    """Causal attention of ragged query batches (prefill, chunked prefill, mixed) over the paged cache.

    q ``[T, Hq, D]`` (request r's tokens at ``query_start_loc[r]:query_start_loc[r + 1]``, the last ones of
    its ``seq_lens[r]`` positions); caches, block table, sinks, window, soft-cap and ``kv_scales`` as in
    :func:`paged_decode`. The new tokens' keys and values must already be in the cache. Writes and returns
    ``out`` ``[T, Hq, D]``.
    """
    T, Hq, D = q.shape
    page, Hkv = _check(q, key_cache, value_cache)
    *scale_args, kv_quant = _scale_args(kv_scales, key_cache, q)
    if out is None:
        out = torch.empty_like(q)
    R = seq_lens.shape[0]
    if T == 0 or R == 0:
        return out
    G = Hq // Hkv
    default_m, default_cfg = prefill_config(D, G, q.device, kv_quant)
    bm, cfg = block_m or default_m, config or default_cfg
    bq = bm // G
    _paged_prefill_kernel[(T // bq + R, Hkv)](
        q, q.stride(0), q.stride(1),
        key_cache, key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache, value_cache.stride(0), value_cache.stride(1), value_cache.stride(2), *scale_args,
        block_table, block_table.stride(0), seq_lens, query_start_loc, sinks if sinks is not None else q,
        out, out.stride(0), out.stride(1), R, float(scale), float(softcap), int(window_left),
        **prefill_constexprs(G, D, page, bm, cfg, sinks=sinks is not None, softcap=softcap > 0,
                             window=window_left >= 0, cuda=torch.version.hip is None, kv_quant=kv_quant,
                             kv_align=kv_alignment(key_cache, value_cache)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out
