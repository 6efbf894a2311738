"""Which attention calls the decode kernel takes: plain checks on the layer (once, at construction) and on
each batch's metadata; a reason code for everything it does not take, served by vLLM's Triton attention.

Imports torch only (no vLLM), so the decisions are unit-testable apart from the backend. The switches are
declared in spec.py and read through ``infera_vllm.switches.op_value`` (the rules the plugin checked them with).
"""

import torch

from infera_ops.attn_paged.spec import SPEC
from infera_vllm.switches import op_value

HEAD_SIZES = (64, 80, 96, 128, 256)
DTYPES = (torch.bfloat16, torch.float16)
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16")
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


def prefill_on_fa3(route: str, fa3_reason: str | None, head_size: int) -> bool:
    """Does FA3 take this layer's prefill and mixed batches? ``fa3_reason`` is None where vLLM's FA3 runs here
    (backend.fa3_unavailable), else why not; FA3 takes head sizes up to 256 in multiples of 8."""
    return route in ("auto", "fa3") and fa3_reason is None and head_size % 8 == 0 and head_size <= 256


def platform_default() -> bool:
    """``INFERA_ATTN_PAGED_DEFAULT``: 1 the backend is vLLM's automatic choice where it validates; 0 (default)
    only ``--attention-backend CUSTOM`` selects it."""
    return op_value(SPEC, "INFERA_ATTN_PAGED_DEFAULT")


def layer_decline(attn_type: str, head_size: int, kv_cache_dtype: str, alibi_slopes, use_alibi_sqrt: bool,
                  chunk_lookback: int) -> str | None:
    """None when the layer's attention can run on the kernel, else a reason code (decided once per layer)."""
    if str(getattr(attn_type, "value", attn_type)).lower() != "decoder":
        return "attn-type"  # encoder, encoder-only (non-causal) and cross attention
    if alibi_slopes is not None or use_alibi_sqrt:
        return "alibi"
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        return "kv-cache-dtype"  # fp8 / int8 / int4 KV caches
    if head_size not in HEAD_SIZES:
        return "head-size"
    if chunk_lookback != -1:
        return "chunked-local"
    return None


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
