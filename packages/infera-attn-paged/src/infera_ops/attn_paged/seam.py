"""The vLLM side of infera-attn-paged, and how it is installed.

``InferaAttentionBackend`` is vLLM's Triton backend (same KV-cache layout, same metadata; the KV write is
FLASH_ATTN's compiled one where the build has it, :func:`compiled_cache_write`)
whose ``forward`` runs the split-KV decode kernel on pure decode batches, and prefill and mixed batches on the
fastest kernel there is for them: FlashAttention-3 (vLLM's build, over the same cache views, with the step's
schedule from vLLM's FLASH_ATTN builder, as FLASH_ATTN calls it) where it runs on this GPU, counted as route
``fa3``, else the ragged prefill kernel (kernels.py). What they cannot serve goes
to the parent, so such a call runs exactly what ``TRITON_ATTN`` would have run. Every decision is counted
(policy.py has the reasons). ``INFERA_ATTN_PAGED_PREFILL`` (policy.prefill_route) overrides the prefill
route: ``kernel``, ``fa3`` or ``triton`` (the parent by design, ``prefill-handover``).

Installed (``activate``) in vLLM's ``CUSTOM`` attention slot, selected with ``--attention-backend CUSTOM``:
nothing changes until the user selects it, and vLLM's automatic choice on CUDA (FLASH_ATTN first on sm90) is
left alone. Not registered under a name of its own on 0.32, although ``register_backend("NAME", ...)``
exists there: such a member pickles by value and fails to unpickle in spawned workers before they load
plugins (docs/vllm-seams.md, Attention); ``CUSTOM`` does not. ``INFERA_ATTN_PAGED_DEFAULT=1`` makes it the
platform's automatic choice (``make_platform_default``): where no backend was selected and it validates for
the layer. No GPU family is validated for that by measurement yet, so nowhere is it on unless the user sets
it. Declines on the CPU without ``TRITON_INTERPRET=1`` (``triton-interpreter-off``); with it the backend is
registered for validation. The CPU platform ignores ``--attention-backend``, so there the default switch is
the way in (validation only: the interpreter is orders of magnitude slower), and vLLM's CPU engine then runs
every attention call on the kernels. The plugin imports this module only once the spec's checks passed (it
imports torch and vLLM).

Self-check (infera_vllm.self_check): the first eager call of each batch kind and token bucket (``decode 3-4``,
``prefill 17-32``) also runs vLLM's implementation into a separate output and compares the rows the kernel
wrote; a mismatch hands that bucket to the parent for the rest of the process (``self-check-mismatch``), the
checked call included. vLLM's implementation is FlashAttention-3 where it runs the layer (FLASH_ATTN, what
vLLM runs on Hopper; ahead-of-time compiled, so a check costs no JIT compile), else the parent's forward
(TRITON_ATTN). vLLM's CPU build disables its Triton kernels, so there (validation only) the stand-in is the
fp32 reference over the same cache views (reference.py). vLLM's warm-up batches (the eager runs before each
CUDA-graph capture, where decode buckets are first seen) give each sequence one key, which makes attention a
copy of that key's value in any kernel, or read a cache that holds no keys or values yet, so both outputs
are zero: neither proves anything. Such a call is checked with random keys and values written into the
blocks its block table names (both kernels on the same filled blocks, vLLM's first), which are then
restored, one-key decode sequences lengthened to CHECK_KEYS keys, so the check sees the call's own shapes,
block table and layer settings on data that can tell two kernels apart.

KV layout across versions: 0.24 hands ``kv_cache`` as ``(num_blocks, 2, block_size, Hkv, D)``; 0.26 and 0.32
as ``(num_blocks, Hkv, block_size, 2·D)`` (K and V packed along the last dim). Both become the kernel's
``[num_blocks, block_size, Hkv, D]`` views without a copy.
"""

from __future__ import annotations

import copy
from typing import NamedTuple

import torch
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadataBuilder,
)

from infera_ops.attn_paged import launch, policy, reference
from infera_ops.attn_paged.spec import SPEC
from infera_vllm import coverage, seams, self_check
from infera_vllm.platform import interpreter_off
from infera_vllm.spec import Decline

BACKEND = "infera_ops.attn_paged.seam.InferaAttentionBackend"


def check(ctx) -> Decline | None:
    """The platform and the tuning file: one that cannot be used declines the op ``bad-tuning`` with the
    message (as the other ops name it), in serving and in ``doctor`` alike. The switches (spec.py) were
    parsed by the plugin before this; a refused value declined the op ``bad-switch``."""
    off = interpreter_off(ctx.env.gpu_family, "vLLM's CPU attention")
    if off is not None:
        return off
    try:
        policy.load(ctx.env.gpu_family or "unknown")
    except policy.TuningError as exc:
        return Decline("bad-tuning", str(exc))
    return None


def activate(ctx) -> Decline | None:
    """Installs the backend; the plugin calls it only once ``check(ctx)`` passed."""
    from vllm.v1.attention.backends import registry

    default = policy.platform_default(ctx.env.gpu_family)

    custom = registry.AttentionBackendEnum.CUSTOM
    seams.register(ctx.spec.name, registry, "_ATTN_OVERRIDES", custom,
                   lambda: registry.register_backend(custom, BACKEND))
    ctx.note = "registered as attention backend CUSTOM (select with --attention-backend CUSTOM)"
    if default:
        make_platform_default(ctx.spec.name)
        why = ("INFERA_ATTN_PAGED_DEFAULT=1" if ctx.switch("INFERA_ATTN_PAGED_DEFAULT")
               else f"measured on {ctx.env.gpu_family}; INFERA_ATTN_PAGED_DEFAULT=0 turns it off")
        ctx.note = f"vLLM's automatic attention choice where it validates ({why}), and CUSTOM"
    return None


def plan(site) -> Decline | None:
    """Would the backend's kernels take this attention layer (``doctor --model``)? Where the backend serves it:
    ``--attention-backend CUSTOM``, or vLLM's automatic choice (:func:`policy.platform_default`); per batch,
    fp32 queries and the other per-call reasons still apply."""
    from infera_vllm.platform import detect_gpu_family

    if site.attrs.get("head_size") not in policy.HEAD_SIZES:
        return Decline("head-size", f"head size {site.attrs.get('head_size')} not in {policy.HEAD_SIZES}")
    family = detect_gpu_family()[0]
    why = policy.declined_head_size(site.attrs["head_size"], family)
    if why is not None:
        return Decline("head-size-on-family", f"head size {site.attrs['head_size']} on {family}: {why}")
    if str(site.attrs.get("dtype", "bfloat16")).replace("torch.", "") not in ("bfloat16", "float16"):
        return Decline("dtype", f"{site.attrs.get('dtype')}: the kernels take bf16/fp16")
    return None


OP_NAME = "attn-paged"
CHECK_KEYS = 1024  # keys per sequence when the self-check lengthens a one-key decode batch (several slices)
_count = coverage.CallCounts(OP_NAME, policy.HANDOVERS, policy.ROUTES)
_check = self_check.Checker(OP_NAME, SPEC.self_check_bound)
_FA3: list = []  # [flash_attn_varlen_func or None, reason or None], resolved once per process
_CACHE_WRITE: list = []  # [vLLM's compiled reshape_and_cache_flash or None], resolved once per process


def vllm_triton_runs() -> bool:
    """Whether vLLM's own Triton kernels run in this process (False on its CPU build, which disables them
    because Triton has no CPU backend there): then the parent's forward can serve a call."""
    import vllm.triton_utils

    return bool(getattr(vllm.triton_utils, "HAS_TRITON", torch.cuda.is_available()))


def fa3_unavailable() -> str | None:
    """None where vLLM's FlashAttention-3 runs on this GPU (its own check), else why not (another platform,
    a GPU before Hopper, a vLLM build without it)."""
    if not _FA3:
        try:
            from vllm.vllm_flash_attn import flash_attn_varlen_func
            from vllm.vllm_flash_attn.flash_attn_interface import fa_version_unsupported_reason, is_fa_version_supported
        except Exception as exc:  # noqa: BLE001  (any import failure means: not here)
            _FA3[:] = [None, f"vllm.vllm_flash_attn: {exc}"]
        else:
            ok = torch.cuda.is_available() and is_fa_version_supported(3)
            _FA3[:] = [flash_attn_varlen_func if ok else None, None if ok else str(fa_version_unsupported_reason(3))]
    return _FA3[1]


def compiled_cache_write():
    """vLLM's compiled KV write, ``reshape_and_cache_flash`` (its CUDA / ROCm build's ``_C_cache_ops``), which
    FLASH_ATTN calls over the same cache views, or None where this build lacks it (vLLM's CPU build). The
    Triton backend's write is a Triton kernel with the same result whose Python launcher costs tens of
    microseconds of host time per layer: where a forward runs eagerly (prefills beyond the CUDA-graph sizes)
    and the host sets the pace, that made a short prefill measurably slower than FLASH_ATTN's (on the H200,
    cProfile of a batch-1 256-token prefill of Llama-3-8B: 9.0 ms in the Triton writes against 2.5 ms in
    FLASH_ATTN's, 32 layers). Captured in a CUDA graph the Triton kernel is the faster one (1.5 against 2.1
    us per decode layer), so graphs keep it (InferaAttentionImpl.do_kv_cache_update)."""
    if not _CACHE_WRITE:
        op = None
        try:
            import vllm._custom_ops  # noqa: F401  (loads vllm._C, which registers the cache ops)

            op = torch.ops._C_cache_ops.reshape_and_cache_flash
        except (ImportError, AttributeError, RuntimeError):
            op = None
        _CACHE_WRITE[:] = [op]
    return _CACHE_WRITE[0]


def kv_views(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value caches as ``[num_blocks, block_size, Hkv, D]`` views of vLLM's KV tensor."""
    if kv_cache.dim() == 5:  # 0.24: (num_blocks, 2, block_size, Hkv, D)
        return kv_cache.unbind(1)
    return kv_cache.transpose(1, 2).split(head_size, dim=-1)


def block_size(kv_cache: torch.Tensor) -> int:
    """Tokens per cache page, from vLLM's KV tensor in either layout (dim 2 in both), without making views."""
    return kv_cache.shape[2]


def split_table(max_seqs: int, num_kv_heads: int, device, head_size: int) -> list[int]:
    """The decode kernel's slice cap for each batch size 0..max_seqs (index = batch size)."""
    return [1] + [launch.split_cap(b, num_kv_heads, device, head_size=head_size) for b in range(1, max_seqs + 1)]


def workspace_for(splits: list[int], num_heads: int, head_size: int, device) -> launch.Workspace:
    """The decode workspace for every batch size in ``splits`` that splits at all (a cap of 1 writes no
    partials): the cap shrinks as the batch grows, so the largest batch x cap product (at most
    programs_per_sm x SMs / KV heads rows) bounds it, not max_num_seqs x MAX_SPLITS."""
    rows = max((b * s for b, s in enumerate(splits) if s > 1), default=0)
    return launch.Workspace(rows, num_heads, head_size, device)


class Fa3Schedule(NamedTuple):
    """What vLLM's FLASH_ATTN builder computes once per step for FA3 and passes to every layer's call:
    ``scheduler_metadata`` (FA3's ``get_scheduler_metadata``: each sequence's query-tile and split counts,
    on the device; None where that builder does not schedule ahead, e.g. layers with different sliding
    windows) and ``num_splits`` (its cap on FA3's splits: under full CUDA graphs the graphs' cap, else 0,
    FA3's own choice)."""

    scheduler_metadata: torch.Tensor | None
    num_splits: int


NO_FA3_SCHEDULE = Fa3Schedule(None, 0)  # FA3 schedules the call itself, with its own split choice


def fa3_schedule_builder(kv_cache_spec, layer_names, vllm_config, device, head_size: int):
    """vLLM's FLASH_ATTN metadata builder for this KV-cache group, whose per-step schedule (:class:`Fa3Schedule`)
    the ``fa3`` prefill route passes to FA3 as FLASH_ATTN does: without it FA3 computes the same schedule
    inside every layer's call (a tile-counter allocation and a scheduling kernel per layer, host time that a
    short prefill, run eagerly, pays 32-48 times a step). None where FA3 takes no prefills of this backend
    (another platform or route, :func:`policy.prefill_on_fa3`), and where vLLM's builder cannot be built here
    (logged: FA3 then schedules inside each call, as before)."""
    if not policy.prefill_on_fa3(policy.prefill_route(), fa3_unavailable(), head_size,
                                 vllm_config.cache_config.cache_dtype):
        return None
    try:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

        return FlashAttentionMetadataBuilder(kv_cache_spec, layer_names, vllm_config, device)
    except Exception as exc:  # noqa: BLE001  (vLLM's own class on a version or config it does not take)
        from infera_vllm import log

        log.warning("infera-vllm: attn-paged: FLASH_ATTN's metadata builder is not built here (%s: %s): FA3 "
                    "schedules each prefill call itself", type(exc).__name__, exc)
        return None


class InferaAttentionMetadataBuilder(TritonAttentionMetadataBuilder):
    """Triton's builder plus the decode kernel's slice cap and workspace, both fixed per batch size (each
    sequence's slice count is chosen on the device from its length), so a full CUDA graph captured at one
    batch size replays with any context length; for a prefill or mixed batch where FA3 serves those, also
    FLASH_ATTN's FA3 schedule for the step (``infera_fa3``: :func:`fa3_schedule_builder`; None otherwise)."""

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._infera_splits = split_table(vllm_config.scheduler_config.max_num_seqs, self.num_heads_kv, device,
                                          self.headdim)
        self.infera_workspace = workspace_for(self._infera_splits, self.num_heads_q, self.headdim, device)
        self._infera_fa3 = fa3_schedule_builder(kv_cache_spec, layer_names, vllm_config, device, self.headdim)

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        md = super().build(common_prefix_len, common_attn_metadata, fast_build)
        num_seqs = common_attn_metadata.num_reqs
        md.infera_num_splits = (self._infera_splits[num_seqs] if num_seqs < len(self._infera_splits)
                                else launch.split_cap(num_seqs, self.num_heads_kv, self.device, head_size=self.headdim))
        md.infera_workspace = self.infera_workspace
        md.infera_fa3 = None
        if self._infera_fa3 is not None and not policy.is_decode(
                common_attn_metadata.max_query_len, common_attn_metadata.num_actual_tokens, num_seqs):
            fa = self._infera_fa3.build(common_prefix_len, common_attn_metadata, fast_build)
            md.infera_fa3 = Fa3Schedule(fa.scheduler_metadata, fa.max_num_splits)
        return md


def _family() -> str:
    """The GPU family of the device this process builds its layers on (sm90, gfx1100, ...; cpu)."""
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    return policy.family_of(device)


class InferaAttentionImpl(TritonAttentionImpl):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._infera_layer_decline = policy.layer_decline(
            self.attn_type, self.head_size, self.kv_cache_dtype, self.alibi_slopes,
            getattr(self, "use_alibi_sqrt", False), getattr(self, "chunk_lookback", -1), _family())
        self._infera_window = self.sliding_window[0] if self.sliding_window[0] >= 0 else -1
        self._infera_softcap = float(self.logits_soft_cap or 0.0)
        self._infera_kv_quant = policy.kv_quant(self.kv_cache_dtype)
        route = policy.prefill_route()  # validated when the op activated
        if policy.prefill_on_fa3(route, fa3_unavailable(), self.head_size, self.kv_cache_dtype):
            self._infera_prefill = policy.FA3
        else:
            self._infera_prefill = "triton" if route == "triton" else "kernel"
        # the self-check's stand-in for vLLM: FA3 wherever it runs this layer, whatever the prefill route (for a
        # quantized cache TRITON_ATTN's forward: FA3 would quantize the queries)
        self._infera_fa3_reference = policy.prefill_on_fa3("fa3", fa3_unavailable(), self.head_size,
                                                           self.kv_cache_dtype)
        if self._infera_layer_decline is not None:
            _count(self._infera_layer_decline, None, "plan")
        elif self._infera_kv_quant:
            # the kernels read a quantized cache with the queries in the model's dtype: vLLM's attention layer
            # quantizes the queries to fp8 only for an implementation that says it takes them so (read when the
            # layer is built, after this)
            self.supports_quant_query_input = False

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                output_block_scale=None):
        if attn_metadata is None:  # profiling run: the parent zero-fills
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                   output_block_scale)
        seq_lens = attn_metadata.seq_lens
        num_seqs, tokens = seq_lens.shape[0], attn_metadata.num_actual_tokens
        decode = policy.is_decode(attn_metadata.max_query_len, tokens, num_seqs)
        reason = self._infera_layer_decline
        checking = False
        if reason is None:
            extras = (getattr(attn_metadata, "mm_prefix_range_tensor", None) is not None
                      or getattr(attn_metadata, "rswa_prefix_lens", None) is not None)
            capturing = query.is_cuda and torch.cuda.is_current_stream_capturing()
            # FA3 picks its schedule from this batch's lengths: outside CUDA graphs only (under a full graph
            # a captured prefill or mixed batch runs the ragged kernel, whose grid is fixed by its shape)
            prefill = self._infera_prefill
            if prefill == policy.FA3 and not decode and (capturing or block_size(kv_cache) % 16):
                prefill = "kernel"  # FA3's paged cache takes pages of a multiple of 16 tokens
            reason = policy.batch_decline(query, decode, prefill, extras,
                                          output_scale is not None or output_block_scale is not None,
                                          attn_metadata.causal)
            workspace = getattr(attn_metadata, "infera_workspace", None)
            splits = getattr(attn_metadata, "infera_num_splits", 1) if decode else 1
            if reason is None and splits > 1 and (workspace is None or not workspace.fits(
                    num_seqs, self.num_heads, self.head_size, splits)):
                reason = "workspace"
            bucket, checking = None, False
            if not _check.idle:  # with the check off and nothing declined, no bucket key per call
                bucket = f"{'decode' if decode else 'prefill'} {coverage.bucket_of(tokens)}"
                if reason is None and _check.declined(bucket):
                    reason = self_check.MISMATCH
                checking = reason is None and _check.wants(bucket, capturing)
            if not checking:  # a checked call is counted once judged
                _count(reason, tokens, "plan" if capturing else "call")
        if reason == policy.FA3:
            return self._fa3_forward(query, kv_cache, attn_metadata, output)
        if reason == self_check.MISMATCH:
            return self._vllm_forward(layer, query, key, value, kv_cache, attn_metadata, output, decode)
        if reason is not None:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                   output_block_scale)
        rows = num_seqs if decode else tokens  # the rows the kernel writes
        # a decode batch whose sequences hold one key each (vLLM's warm-up runs) makes attention a copy of the
        # values in any kernel: checked on longer sequences instead (_on_filled_blocks). From the lengths
        # themselves (a sync, on a checked call only): vLLM's warm-up metadata may state a larger maximum
        one_key = checking and decode and num_seqs > 0 and int(seq_lens.max()) <= 1
        theirs = None
        if checking and not one_key:
            with _check.timed(bucket):
                theirs = self._vllm_forward(layer, query, key, value, kv_cache, attn_metadata,
                                            torch.empty_like(output), decode)
        self._kernel(layer, query, kv_cache, attn_metadata, output, decode, splits, workspace)
        _check.perturb(output[:rows])
        if checking:  # on a mismatch the call returns vLLM's result
            if one_key or (not bool(output[:rows].any()) and not bool(theirs[:rows].any())):  # or an empty cache
                ours_checked, theirs_checked = self._on_filled_blocks(layer, query, key, value, kv_cache,
                                                                      attn_metadata, output, decode, splits,
                                                                      workspace, rows, bucket, one_key)
            else:
                ours_checked, theirs_checked = output[:rows], theirs[:rows]
            agreed = _check.judge(bucket, ours_checked, theirs_checked, tuple(query[:rows].shape))
            if not agreed:
                if theirs is None:
                    theirs = self._vllm_forward(layer, query, key, value, kv_cache, attn_metadata,
                                                torch.empty_like(output), decode)
                output[:rows].copy_(theirs[:rows])
            _count(None if agreed else self_check.MISMATCH, tokens, "call")
        return output

    def _caches(self, layer, kv_cache) -> tuple[torch.Tensor, torch.Tensor, launch.KVScales | None]:
        """(key cache, value cache, scales) as the kernels read them: the ``[num_blocks, block_size, Hkv, D]``
        views of vLLM's KV tensor, and where it is quantized, typed as TRITON_ATTN types them (fp8 as the
        platform's fp8 dtype, which TRITON_ATTN's write stores for every fp8 cache dtype) with its scales: the
        layer's per-tensor ``_k_scale`` / ``_v_scale``, or the per-(token, head) scale caches TRITON_ATTN
        carves from each head's padding (``_pth_key_value_caches``; data views cut to the head size)."""
        if self._infera_kv_quant == launch.KV_PER_TOKEN_HEAD:
            key_cache, value_cache = self._pth_key_value_caches(kv_cache)
            return (key_cache[..., :self.head_size], value_cache[..., :self.head_size],
                    launch.KVScales(launch.KV_PER_TOKEN_HEAD, self._k_scale_cache, self._v_scale_cache))
        key_cache, value_cache = kv_views(kv_cache, self.head_size)
        if self._infera_kv_quant == launch.KV_PER_TENSOR:
            if key_cache.dtype != self.fp8_dtype:
                key_cache, value_cache = key_cache.view(self.fp8_dtype), value_cache.view(self.fp8_dtype)
            return key_cache, value_cache, launch.KVScales(launch.KV_PER_TENSOR, layer._k_scale, layer._v_scale)
        return key_cache, value_cache, None

    def _kernel(self, layer, query, kv_cache, md, output, decode: bool, splits: int, workspace):
        """The decode or ragged prefill kernel on this call, into ``output``."""
        key_cache, value_cache, scales = self._caches(layer, kv_cache)
        if decode:
            n = md.seq_lens.shape[0]
            launch.paged_decode(query[:n], key_cache, value_cache, md.block_table, md.seq_lens, self.scale, output[:n],
                                sinks=self.sinks, window_left=self._infera_window, softcap=self._infera_softcap,
                                num_splits=splits, workspace=workspace, kv_scales=scales)
        else:
            n = md.num_actual_tokens
            launch.paged_prefill(query[:n], key_cache, value_cache, md.block_table, md.seq_lens, md.query_start_loc,
                                 self.scale, output[:n], sinks=self.sinks, window_left=self._infera_window,
                                 softcap=self._infera_softcap, kv_scales=scales)

    def _on_filled_blocks(self, layer, query, key, value, kv_cache, md, output, decode: bool, splits: int,
                          workspace, rows: int, bucket: str, lengthen: bool = False):
        """(ours, vLLM's) outputs of this call with the blocks its block table names filled with random keys
        and values and a random query (N(0, 1)), vLLM's implementation first; the blocks are restored after.
        The query is random too: a warm-up batch's queries are placeholders whose scores against random keys
        can make the softmax one-hot or uniform, where every kernel rounds to the same bf16 output (on the
        H200 such checks against FA3 gave an error of exactly 0: a comparison that cannot fail). ``lengthen``
        (a decode batch): every sequence also takes CHECK_KEYS keys, or as many as its block-table row holds
        if fewer, so that a check of one-key sequences compares a softmax, not a copy."""
        key_cache, value_cache, _ = self._caches(layer, kv_cache)
        if lengthen:
            md = copy.copy(md)
            keys = min(CHECK_KEYS, md.block_table.shape[1] * key_cache.shape[1])
            md.seq_lens, md.max_seq_len = torch.full_like(md.seq_lens, keys), keys
            md.infera_fa3 = None  # a schedule is for the step's own lengths
        pages = -(-md.max_seq_len // key_cache.shape[1])
        blocks = torch.unique(md.block_table[:md.seq_lens.shape[0], :pages].long())
        blocks = blocks[(blocks >= 0) & (blocks < key_cache.shape[0])]
        saved = key_cache[blocks].clone(), value_cache[blocks].clone()
        gen = torch.Generator(device=key_cache.device).manual_seed(0)
        query = torch.randn(query.shape, generator=gen, device=query.device, dtype=torch.float32).to(query.dtype)
        try:
            for cache in (key_cache, value_cache):
                noise = torch.randn(cache[blocks].shape, generator=gen, device=cache.device, dtype=torch.float32)
                # int8 elements (per-token-head caches, whose scales stay as written) span their range
                cache[blocks] = (noise * 40).clamp(-127, 127).round().to(cache.dtype) if cache.dtype == torch.int8 \
                    else noise.to(cache.dtype)
            with _check.timed(bucket):
                theirs = self._vllm_forward(layer, query, key, value, kv_cache, md, torch.empty_like(output), decode)
            ours = torch.empty_like(output)
            self._kernel(layer, query, kv_cache, md, ours, decode, splits, workspace)
            _check.perturb(ours[:rows])
        finally:
            key_cache[blocks], value_cache[blocks] = saved
        return ours[:rows], theirs[:rows]

    def _vllm_forward(self, layer, query, key, value, kv_cache, md, output, decode: bool):
        """vLLM's implementation of this call, into ``output``: FlashAttention-3 where it runs this layer
        (FLASH_ATTN, vLLM's choice on Hopper, compiled ahead of time: a check costs no JIT compile), else the
        parent's forward (TRITON_ATTN's kernel); where vLLM's Triton kernels do not run (its CPU build) the
        fp32 reference over the same views, in the output's dtype."""
        if self._infera_fa3_reference and block_size(kv_cache) % 16 == 0:
            return self._fa3_forward(query, kv_cache, md, output)
        if vllm_triton_runs():
            return super().forward(layer, query, key, value, kv_cache, md, output)
        key_cache, value_cache, scales = self._caches(layer, kv_cache)
        common = dict(sinks=self.sinks, window_left=self._infera_window, softcap=self._infera_softcap,
                      kv_scales=scales)
        if decode:
            n = md.seq_lens.shape[0]
            ref = reference.paged_decode_reference(query[:n], key_cache, value_cache, md.block_table, md.seq_lens,
                                                   self.scale, **common)
        else:
            n = md.num_actual_tokens
            ref = reference.paged_prefill_reference(query[:n], key_cache, value_cache, md.block_table, md.seq_lens,
                                                    md.query_start_loc, self.scale, **common)
        output[:n].copy_(ref)
        return output

    def _fa3_forward(self, query, kv_cache, md, output):
        """A prefill or mixed batch on FlashAttention-3, called as vLLM's FLASH_ATTN backend calls it
        (FlashAttentionImpl.forward: varlen over the paged cache views, causal, the layer's window, soft-cap
        and sinks, the step's FA3 schedule and split cap from FLASH_ATTN's builder: ``md.infera_fa3``) on the
        Triton builder's metadata; where the step has no schedule (metadata built elsewhere), FA3 computes it
        from the same lengths."""
        key_cache, value_cache = kv_views(kv_cache, self.head_size)
        tokens = md.num_actual_tokens
        window = [self._infera_window, 0] if self._infera_window >= 0 else [-1, -1]
        # FA3 takes bf16 sinks; converted per call (Hq values), not at construction: the layer's sinks are
        # loaded into the same tensor after the impl is built, and a copy made then would keep the init values
        sinks = self.sinks
        s_aux = None if sinks is None else sinks if sinks.dtype == torch.bfloat16 else sinks.to(torch.bfloat16)
        schedule = getattr(md, "infera_fa3", None) or NO_FA3_SCHEDULE
        _FA3[0](q=query[:tokens], k=key_cache, v=value_cache, out=output[:tokens], cu_seqlens_q=md.query_start_loc,
                max_seqlen_q=md.max_query_len, seqused_k=md.seq_lens, max_seqlen_k=md.max_seq_len,
                softmax_scale=self.scale, causal=True, window_size=window, block_table=md.block_table,
                softcap=self._infera_softcap, scheduler_metadata=schedule.scheduler_metadata,
                num_splits=schedule.num_splits, fa_version=3, s_aux=s_aux)
        return output

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        """The KV write into the cache views the kernels read, the same bytes either way: on GPUs, run
        eagerly, vLLM's compiled write as FLASH_ATTN does it (:func:`compiled_cache_write`: little host time)
        where the build has it; under CUDA-graph capture, and where the build lacks it, the parent's Triton
        write (the faster kernel on the device: 1.5 against 2.1 us per decode layer on the H200, and a
        replayed graph pays no launch cost); on the CPU (validation under the interpreter: vLLM's CPU build
        disables its Triton kernels) the same write as a torch index-put (reference.quantize_* for a quantized
        cache). A layer the backend declined keeps the parent's write (its KV-cache dtype may be one only that
        write stores), and so does a quantized cache on GPUs: TRITON_ATTN's write is what its own forward, the
        per-batch fallback, reads (it stores every fp8 cache dtype as the platform's fp8 type, where the compiled
        write would store ``fp8_e5m2`` as e5m2)."""
        if self._infera_layer_decline is not None:
            return super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
        if kv_cache.device.type != "cpu":
            write = compiled_cache_write()
            if write is None or self._infera_kv_quant or torch.cuda.is_current_stream_capturing():
                return super().do_kv_cache_update(layer, key, value, kv_cache, slot_mapping)
            # the slot mapping's length is the token count: key and value may be padded beyond it
            write(key, value, *kv_views(kv_cache, self.head_size), slot_mapping, self.kv_cache_dtype,
                  layer._k_scale, layer._v_scale)
            return None
        key_cache, value_cache, scales = self._caches(layer, kv_cache)
        n = slot_mapping.shape[0]
        live = slot_mapping >= 0  # padded tokens carry slot -1
        slots = slot_mapping[live]
        at = slots // key_cache.shape[1], slots % key_cache.shape[1]
        new_keys, new_values = key[:n][live], value[:n][live]
        if scales is None:
            key_cache[at], value_cache[at] = new_keys.to(key_cache.dtype), new_values.to(value_cache.dtype)
        elif scales.mode == launch.KV_PER_TENSOR:
            key_cache[at] = reference.quantize_per_tensor(new_keys, scales.k, key_cache.dtype)
            value_cache[at] = reference.quantize_per_tensor(new_values, scales.v, value_cache.dtype)
        else:
            key_cache[at], scales.k[at] = reference.quantize_per_token_head(new_keys, key_cache.dtype)
            value_cache[at], scales.v[at] = reference.quantize_per_token_head(new_values, value_cache.dtype)


def make_platform_default(op_name: str) -> None:
    """vLLM's automatic backend choice (no ``--attention-backend``) becomes this backend wherever vLLM's own
    validation accepts it for the layer (head size, dtype, KV-cache dtype, block size, MLA, sinks, ...; the
    platform passes exactly what its selector would) and the kernel would serve it (:func:`policy.default_decline`:
    a layer it declines would run on the Triton parent, not on what vLLM would choose), else vLLM's own
    choice; an explicit selection is
    untouched. Wraps the current platform class's ``get_attn_backend_cls`` through :mod:`infera_vllm.seams`
    under ``op_name``, once per process (a forked child inherits it); each refusal is counted at plan
    (``not-default``) and its first reason logged once."""
    from vllm.platforms import current_platform

    from infera_vllm import log, seams

    logged: set[str] = set()
    explicit = policy.default_explicit()

    def make(original):
        def get_attn_backend_cls(cls, selected_backend, attn_selector_config, *args, **kwargs):
            if selected_backend is None:
                reasons = InferaAttentionBackend.validate_configuration(
                    device_capability=cls.get_device_capability(), **attn_selector_config._asdict())
                if not reasons:
                    decline = policy.default_decline(getattr(attn_selector_config, "attn_type", None),
                                                     attn_selector_config.head_size,
                                                     attn_selector_config.kv_cache_dtype, _family(), explicit)
                    if decline is None:
                        return f"{InferaAttentionBackend.__module__}.{InferaAttentionBackend.__qualname__}"
                    reasons = [f"{decline}: the kernel would hand every call to TRITON_ATTN's implementation"]
                _count("not-default", None, "plan")
                if reasons[0] not in logged:
                    logged.add(reasons[0])
                    log.info("infera-vllm: attn-paged is not the default for a layer (%s): vLLM chooses",
                             reasons[0])
            return original(selected_backend, attn_selector_config, *args, **kwargs)

        return classmethod(get_attn_backend_cls)

    seams.wrap(op_name, type(current_platform), "get_attn_backend_cls", make)


class InferaAttentionBackend(TritonAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "CUSTOM"  # the registry slot it fills; vLLM maps the layer's backend by this name

    @staticmethod
    def get_impl_cls() -> type[InferaAttentionImpl]:
        return InferaAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[InferaAttentionMetadataBuilder]:
        return InferaAttentionMetadataBuilder
