"""Which attention calls the kernels take, and with which launch settings.

Which calls: plain checks on the layer (once, at construction) and on each batch's metadata; a reason code for
everything the kernels do not take, served by vLLM's Triton attention. Imports torch only (no vLLM), so the
decisions are unit-testable apart from the backend. The switches are declared in spec.py and read through
``infera_vllm.switches.op_value`` (the rules the plugin checked them with).

Launch settings: per GPU family, by head size, the decode and prefill kernels' tile, warps, stages, split
policy and programmatic dependent launch. One JSON file per family in ``tuning/``: measured on that GPU by
``benchmarks/tune_attn_paged.py`` (sm90), or, for a family no one has measured, the launch sizes that
compile there without spilling (tests/test_attn_paged_compile.py checks every family's);
``INFERA_ATTN_PAGED_TUNING=path.json`` replaces it. A family without a file, or a head size its file does not
cover, uses launch.py's defaults.

File format: ``{"decode": {"64": {...}, "128": {...}}, "prefill": {...}, "measured": {...}}`` where each
decode entry holds ``block_n``, ``num_warps``, ``num_stages``, optionally ``reduce_warps`` (launch.LaunchConfig),
``programs_per_sm``, ``split_keys``, optionally ``max_splits`` (launch.SplitPolicy; default 64) and
``merge_max_slices`` (default 0: the reduce kernel merges at every slice cap) and ``merge_max_registers``
(default 0: the compiler's choice), ``pdl``, and
optionally ``unsplit`` (``{"block_n", "num_warps", "num_stages"}`` for launches whose slice cap is 1,
launch.LaunchConfig.unsplit) and ``unsplit_by_group`` (``{"3": {...} or null, ...}``: per query heads per KV
head, that group's unsplit launch, null for none; other groups take ``unsplit``), and each prefill entry
(optional section) ``block_m`` (the fewest rows; at least the query heads per KV head), ``block_n``,
``num_warps``, ``num_stages``; a head size takes the entry of the
smallest listed size >= it (80 and 96 take 128's), none above the largest. ``declined_head_sizes`` (optional):
``{"256": "why"}``, head sizes the op does not serve on that family (every launch spills there): such layers stay
on vLLM's attention (``head-size-on-family``).
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from infera_ops.attn_paged.spec import SPEC
from infera_vllm import tuning_files
from infera_vllm.switches import op_value

HEAD_SIZES = (64, 80, 96, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)
PLAIN_KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")
# quantized caches the kernels read (kernels.py, Quantized KV caches) -> launch.py's KV_QUANT: fp8 with one scale
# per cache (the checkpoint's k_scale / v_scale, or 1.0), int8 / fp8 with a scale per (token, head) in TRITON_ATTN's
# inline scale slots. int4_per_token_head (packed, rotated, zero points) is not read: ``kv-cache-dtype``.
QUANTIZED_KV_CACHE_DTYPES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8_per_token_head": 2, "fp8_per_token_head": 2}
KV_CACHE_DTYPES = (*PLAIN_KV_CACHE_DTYPES, *QUANTIZED_KV_CACHE_DTYPES)
# By design, not capability limits: coverage route "handover" (strict mode lets them through). Every other
# reason is a capability the kernels lack, counted as a fallback, which INFERA_VLLM_STRICT=1 refuses.
HANDOVERS = ("prefill-handover",)
# Calls given to FlashAttention-3 (vLLM's build) because it is faster there: a route of their own.
FA3 = "fa3"
ROUTES = (FA3,)


def prefill_route() -> str:
    """``INFERA_ATTN_PAGED_PREFILL``: who serves prefill and mixed batches. ``auto`` (default): FA3 where vLLM's
    FA3 runs on this GPU (it is faster than the ragged kernel at every measured prefill shape on the H200,
    docs/operators/attn-paged.md), else the ragged kernel; ``fa3``: FA3 (the ragged kernel where FA3 is
    absent); ``kernel``: the ragged kernel; ``triton``: vLLM's Triton attention (``prefill-handover``)."""
    return op_value(SPEC, "INFERA_ATTN_PAGED_PREFILL")


def prefill_on_fa3(route: str, fa3_reason: str | None, head_size: int, kv_cache_dtype: str = "auto") -> bool:
    """Does FA3 take this layer's prefill and mixed batches? ``fa3_reason`` is None where vLLM's FA3 runs here
    (backend.fa3_unavailable), else why not; FA3 takes head sizes up to 256 in multiples of 8, and plain caches
    only here: it reads an fp8 cache with fp8 queries alone (both products in fp8), and this backend keeps the
    queries in bf16, so a quantized cache's prefills run on the ragged kernel."""
    return (route in ("auto", "fa3") and fa3_reason is None and head_size % 8 == 0 and head_size <= 256
            and not kv_quant(kv_cache_dtype))


# GPU families where the backend is vLLM's automatic attention choice without INFERA_ATTN_PAGED_DEFAULT: those
# where it is `faster` or `neutral` end to end on every model of the validation matrix (docs/validate.md, the
# table of each op's defaults, names the runs). sm90: `faster` on all six models of the H200 matrix
# (benchmarks/results/h200/validation/validation.json, each model's newest entry).
AUTOMATIC_BY_DEFAULT: tuple[str, ...] = ("sm90",)


# GPU families where a layer with a quantized KV cache also takes the backend as vLLM's automatic choice (where
# the backend is that choice at all): none yet, as no family's validation matrix has judged a quantized cache.
# Elsewhere such layers keep vLLM's choice (FLASH_ATTN on sm90 for fp8) unless --attention-backend CUSTOM.
AUTOMATIC_QUANTIZED_KV: tuple[str, ...] = ()


# Families whose launch sizes spill with a quantized cache's tiles (the extra conversions and, per token-head,
# the scale vectors), by KV_QUANT mode: such layers stay on vLLM's attention (``kv-cache-dtype-on-family``)
# until launch sizes that fit are found there (tests/test_attn_paged_compile.py compiles every variant on every
# family and requires a fit wherever the op serves it). sm90 fits every variant.
QUANTIZED_KV_SPILLS = {"gfx942": (2,), "gfx950": (2,), "gfx1100": (1, 2), "gfx1151": (1, 2), "gfx1201": (1, 2)}


def declined_kv_quant(kv_cache_dtype: str, family: str) -> str | None:
    """Why the family does not read this quantized cache (its launches spill), or None."""
    mode = kv_quant(kv_cache_dtype)
    if mode and mode in QUANTIZED_KV_SPILLS.get(family, ()):
        return (f"{kv_cache_dtype} caches: the kernels' launch sizes on {family} spill registers there "
                "(tests/test_attn_paged_compile.py)")
    return None


def kv_quant(kv_cache_dtype: str) -> int:
    """launch.py's KV_QUANT for vLLM's ``kv_cache_dtype``: 0 plain, 1 fp8 per cache, 2 per (token, head)."""
    return QUANTIZED_KV_CACHE_DTYPES.get(kv_cache_dtype, 0)


def platform_default(family: str | None) -> bool:
    """``INFERA_ATTN_PAGED_DEFAULT``: 1 the backend is vLLM's automatic choice where it validates; 0 only
    ``--attention-backend CUSTOM`` selects it; unset, 1 on the families in ``AUTOMATIC_BY_DEFAULT``, else 0."""
    chosen = op_value(SPEC, "INFERA_ATTN_PAGED_DEFAULT")  # a bad value raises even when unset elsewhere
    raw = os.environ.get("INFERA_ATTN_PAGED_DEFAULT")
    return chosen if raw is not None and raw.strip() else family in AUTOMATIC_BY_DEFAULT


def layer_decline(attn_type: str, head_size: int, kv_cache_dtype: str, alibi_slopes, use_alibi_sqrt: bool,
                  chunk_lookback: int, family: str | None = None) -> str | None:
    """None when the layer's attention can run on the kernel, else a reason code (decided once per layer).
    ``family`` (sm90, gfx1100, ...): also a head size that family's tuning file declines (every launch would
    spill); None leaves that check out."""
    if str(getattr(attn_type, "value", attn_type)).lower() != "decoder":
        return "attn-type"  # encoder, encoder-only (non-causal) and cross attention
    if alibi_slopes is not None or use_alibi_sqrt:
        return "alibi"
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        return "kv-cache-dtype"  # int4_per_token_head and dtypes TRITON_ATTN does not name
    if head_size not in HEAD_SIZES:
        return "head-size"
    if chunk_lookback != -1:
        return "chunked-local"
    if family is not None and declined_head_size(head_size, family) is not None:
        return "head-size-on-family"
    if family is not None and declined_kv_quant(kv_cache_dtype, family) is not None:
        return "kv-cache-dtype-on-family"
    return None


def default_explicit() -> bool:
    """Whether ``INFERA_ATTN_PAGED_DEFAULT`` was set to on (not left unset, where the family decides)."""
    raw = os.environ.get("INFERA_ATTN_PAGED_DEFAULT")
    return bool(raw is not None and raw.strip() and op_value(SPEC, "INFERA_ATTN_PAGED_DEFAULT"))


def default_decline(attn_type, head_size: int, kv_cache_dtype: str | None, family: str,
                    explicit: bool = False) -> str | None:
    """The reasons of :func:`layer_decline` that vLLM's backend selector already knows for a layer (attention
    type, head size, KV-cache dtype; a head size the family's tuning file declines): where the backend would
    be vLLM's automatic choice, such a layer keeps vLLM's own choice (FA3 on Hopper) instead of the Triton
    parent the kernel would hand it to. ALiBi and chunked-local attention show only when the layer is built:
    those stay counted declines to the parent. A quantized KV cache the kernels read keeps vLLM's choice too
    where the backend is the automatic choice by its family (``explicit`` False: the switch unset) outside
    ``AUTOMATIC_QUANTIZED_KV`` (``kv-cache-dtype-opt-in``: served under --attention-backend CUSTOM, or with
    ``INFERA_ATTN_PAGED_DEFAULT=1``, the CPU platform's only way in)."""
    kv_cache_dtype = kv_cache_dtype or "auto"
    why = layer_decline(attn_type or "decoder", head_size, kv_cache_dtype, None, False, -1, family)
    if why is None and kv_quant(kv_cache_dtype) and not explicit and family not in AUTOMATIC_QUANTIZED_KV:
        return "kv-cache-dtype-opt-in"
    return why


def is_decode(max_query_len: int, num_actual_tokens: int, num_seqs: int) -> bool:
    """One query token per (padded) sequence: the split-KV decode kernel; otherwise the ragged kernel."""
    return max_query_len == 1 and num_actual_tokens >= num_seqs


def batch_decline(query: torch.Tensor, decode: bool, prefill_route: str, extras_present: bool,
                  quantized_output: bool, causal: object = True) -> str | None:
    """None when the kernels serve this batch, else a reason code (decided per batch). ``causal`` is vLLM's
    metadata flag: True, False, or a per-request tensor; the ragged kernel and the FA3 route are causal only
    (a one-token decode query sees its whole sequence either way). ``prefill_route``: the layer's resolved
    route for prefill and mixed batches ("fa3", "kernel" or "triton")."""
    if quantized_output:
        return "output-quant"
    if query.dtype not in DTYPES:
        return "dtype"
    if extras_present:
        return "mm-prefix-or-rswa"  # multimodal bidirectional prefixes, RSWA prefix lengths
    if not decode and causal is not True:
        return "non-causal"
    if not decode and prefill_route == "triton":
        return "prefill-handover"  # INFERA_ATTN_PAGED_PREFILL=triton: vLLM's Triton kernel serves prefill
    if not decode and prefill_route == FA3:
        return FA3
    return None


class TuningError(ValueError):
    """A tuning file that cannot be used (named, with what is wrong)."""


@dataclass(frozen=True)
class DecodeSettings:
    block_n: int
    num_warps: int
    num_stages: int
    programs_per_sm: int
    split_keys: int
    pdl: bool = True
    reduce_warps: int = 4
    max_splits: int = 64
    unsplit: tuple[int, int, int] | None = None  # (block_n, num_warps, num_stages) where the slice cap is 1
    unsplit_by_group: tuple[tuple[int, tuple[int, int, int] | None], ...] = ()  # (G, launch or None) pairs
    merge_max_slices: int = 0  # the last slice merges up to this cap (launch.SplitPolicy.merge_max_slices)
    merge_max_registers: int = 0  # the merging kernel's register cap (launch.SplitPolicy.merge_max_registers)


@dataclass(frozen=True)
class PrefillSettings:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def family_of(device) -> str:
    """sm90, gfx942, ... for a torch device; "cpu" for the CPU."""
    kind = getattr(device, "type", str(device).split(":")[0])
    return "cpu" if kind != "cuda" else _cuda_family(getattr(device, "index", None))


@functools.lru_cache(maxsize=None)
def _cuda_family(index) -> str:
    import torch

    if torch.version.hip:
        return torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(index)
    return f"sm{major}{minor}"


def _unsplit(entry) -> tuple[int, int, int] | None:
    """A decode entry's ``unsplit`` launch: ``{"block_n", "num_warps", "num_stages"}`` (or null)."""
    if entry is None:
        return None
    if not isinstance(entry, dict) or set(entry) != {"block_n", "num_warps", "num_stages"}:
        raise ValueError(f"unsplit must hold exactly block_n, num_warps and num_stages, not {entry!r}")
    return int(entry["block_n"]), int(entry["num_warps"]), int(entry["num_stages"])


def _unsplit_by_group(entry) -> tuple[tuple[int, tuple[int, int, int] | None], ...]:
    """A decode entry's ``unsplit_by_group``: ``{"G": launch or null}``, as sorted (G, launch) pairs."""
    if not isinstance(entry, dict):
        raise ValueError(f"unsplit_by_group must map query heads per KV head to a launch, not {entry!r}")
    return tuple(sorted((int(g), _unsplit(launch)) for g, launch in entry.items()))


_NESTED = {"unsplit": _unsplit, "unsplit_by_group": _unsplit_by_group}


def _parse(text: str, source: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    doc = tuning_files.document(text, source, TuningError)
    try:
        entries = doc["decode"]
        decode = {int(size): DecodeSettings(**{k: _NESTED[k](v) if k in _NESTED else v
                                               for k, v in entry.items() if k != "measured"})
                  for size, entry in entries.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: not a decode tuning file ({exc})") from exc
    try:
        prefill = {int(size): PrefillSettings(**entry) for size, entry in doc.get("prefill", {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: bad prefill section ({exc})") from exc
    try:
        declined = {int(size): str(why) for size, why in doc.get("declined_head_sizes", {}).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise TuningError(f"{source}: bad declined_head_sizes ({exc})") from exc
    return decode, prefill, declined


@functools.lru_cache(maxsize=None)
def _table(family: str, override: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    """(decode, prefill, declined head sizes) by head size, cached per (family, switch value): the hot path
    reads the file once."""
    found = tuning_files.load("infera_ops.attn_paged", family, "INFERA_ATTN_PAGED_TUNING", override, _parse,
                              TuningError)
    return found or ({}, {}, {})


def load(family: str) -> dict[int, DecodeSettings]:
    """The family's decode table by head size (empty: not tuned); TuningError for a file that cannot be used
    (either section), which the op's activation turns into a decline before any call is served."""
    return _tables(family)[0]


def _tables(family: str) -> tuple[dict[int, DecodeSettings], dict[int, PrefillSettings], dict[int, str]]:
    return _table(family, op_value(SPEC, "INFERA_ATTN_PAGED_TUNING") or "")


def _by_head_size(table: dict, head_size: int):
    fits = [size for size in table if size >= head_size]
    return table[min(fits)] if fits else None


def decode_settings(head_size: int, device) -> DecodeSettings | None:
    """The family's settings for this head size, or None (not tuned: launch.py's defaults)."""
    return _by_head_size(load(family_of(device)), head_size)


def prefill_settings(head_size: int, device) -> PrefillSettings | None:
    """The family's prefill settings for this head size, or None (ops.prefill_config's defaults)."""
    return _by_head_size(_tables(family_of(device))[1], head_size)


def declined_head_size(head_size: int, family: str) -> str | None:
    """Why the family's file declines this head size (every launch spills there), or None."""
    return _tables(family)[2].get(head_size)
