"""Paged attention, bf16: infera's Triton kernels vs vLLM 0.26's FA3 and Triton (unified_attention): decode
(``launch.paged_decode``, split-KV) and, after it, ragged prefill (``launch.paged_prefill``).

Decode: one query token per sequence over a paged KV cache (block size 16, every sequence ``ctx`` keys long), on
the cache exactly as vLLM 0.26's FLASH_ATTN / TRITON_ATTN backends (and ours) see it: the packed tensor of
logical shape ``(num_blocks, Hkv, block_size, 2·D)`` (``get_kv_cache_shape``) over the NHD physical layout
(stride order ``(0, 2, 1, 3)``), split in ``forward`` into the key / value views
``[num_blocks, block_size, Hkv, D]`` (``kv.transpose(1, 2).split(D, dim=-1)``); random block tables (a
permutation of the blocks), N(0, 1) keys and values, queries N(0, Q_STD²).

Baselines, called as vLLM 0.26 calls them:
- FA3: ``vllm.vllm_flash_attn.flash_attn_varlen_func(fa_version=3)`` on the same views (FlashAttentionImpl.
  forward), AOT ``scheduler_metadata`` from ``get_scheduler_metadata`` (FlashAttentionMetadataBuilder.build),
  ``num_splits`` = 32 = ``flash_attn_max_num_splits_for_cuda_graph`` (what the builder passes under full CUDA
  graphs), ``q/k/v_descale`` = the layer's unit scales expanded to (B, Hkv); sinks as bf16 ``s_aux``.
- Triton: ``unified_attention`` with the 3D-split buffers TritonAttentionMetadataBuilder preallocates
  (``seq_threshold_3D`` = 128 // Hkv, 16 softmax segments): batches up to the threshold take the 3D kernel.

Every output is checked against ``reference.paged_decode_reference`` (fp32) on every sequence, after an eager
call and again after the CUDA-graph replays (max abs error < 2e-2); a wrong result shows as ``BAD`` in the
``ok`` column and in a banner under the table. Timing: ``triton.testing.do_bench_cudagraph`` (median of the
replays), each implementation captured separately (ours with its preallocated Workspace). Unless
``--l2 warm``, the calls in a graph cycle over enough copies of the KV cache to exceed 4x the L2 (cold:
every KV byte from HBM, as when each layer reads its own cache), so that "% of copy BW" = KV bytes
(B·ctx·Hkv·D·2·2) / time / the copy ceiling measured in the same run (2 GiB bf16 copy, read + written).
Each row also has ``stream_floor_us``: the same pages, in the same KV copies, read by a plain streaming kernel
in one launch with nothing else to do (``_results.stream_floor_us``), the time a decode step's traffic takes
at this size, launch and ramp included; ``ours_pct_stream_floor`` = it / our time; ``ours_kernels_us``: each
of our kernels' GPU time per call (torch.profiler, eager calls: the decode kernel and the reduce apart).

Prefill section (on by default; ``--no-prefill`` skips it), run after the decode table: heads llama3-8b
(32/8 x 128) and smollm2 (9/3 x 64), block 16, ragged batches (a) plain prefill 1 x 4096, 8 x 1024 and
32 x 256 new tokens; (b) chunked prefill 4 requests x 512 new tokens after 7680 cached ones; (c) mixed: 63
decode requests (1 token after 2048 cached) then one of 2048 new tokens. Inputs as vLLM hands them over:
q ``[T, Hq, D]``, the same packed cache views as above (the new tokens' K/V already in it, random),
block_table ``[R, pages]``, seq_lens ``[R]`` = context + new and query_start_loc ``[R + 1]`` (cumulative new
tokens), all int32. Ours: ``launch.paged_prefill(q, key_cache, value_cache, block_table, seq_lens,
query_start_loc, scale, out)``. FA3: ``flash_attn_varlen_func`` with cu_seqlens_q = query_start_loc,
max_seqlen_q = the longest query, seqused_k = seq_lens, max_seqlen_k = the longest sequence, causal, and the
AOT ``scheduler_metadata`` of FlashAttentionMetadataBuilder.build (v1/attention/backends/flash_attn.py
489-499, 504-530, 632-639): ``num_splits`` = 0 (FA3's own heuristic) in both, since the builder sets
max_num_splits = 32 only for batches of at most max_cudagraph_capture_size (512) tokens and every batch here is
larger (prefill attention runs outside full graphs: piecewise / eager). Triton: ``unified_attention`` as above
with max_seqlen_q > 1, which always takes its 2D kernel. Checked, after the eager call and after the
replays, against an fp32 reference that gathers each request's keys once and applies the causal mask in one
matmul per request and KV head (``reference.paged_prefill_reference_fast``; the CPU test cross-checks it against
``reference.paged_prefill_reference``, which is one decode per query token and too slow for these sizes),
``torch.testing.assert_close``-style: ok iff |out - ref| <= 2e-2 + 2e-2·|ref| everywhere (column err/tol =
the largest |out - ref| / (2e-2 + 2e-2·|ref|)). Timed like decode (do_bench_cudagraph, median) but on a
single KV copy: prefill is compute-bound, so a cold L2 changes little (where a graph capture fails, eager
do_bench timing instead, flagged). Reported: µs, TFLOP/s (FLOPs = 4·D·Hq·Σ over query tokens of the keys
visible to it, causal) and speedups FA3_us / ours_us, triton_us / ours_us; JSON under "prefill", its own
table, and ``bench_attn_paged_prefill.png`` with the dense bf16 ceiling 790 TFLOP/s.

Options: ``--out`` results folder (default results/<gpu>/); ``--sweep`` adds a sweep of our launch configs
and split counts (for llama3-8b and smollm2 heads; ``--sweep-budget-s`` bounds its time); ``--l2 warm``;
``--no-prefill``; ``--traceback`` prints a failed call's traceback. On the CPU,
``meta/infera-vllm/tests/test_bench_attn_paged.py`` runs this benchmark's cases at tiny sizes under Triton's
interpreter (builders, layout, references, our kernel, the FA3 and Triton arguments), without timing.

    python benchmarks/bench_attn_paged.py [--sweep] [--out DIR]
"""

from __future__ import annotations

import gc
import itertools
import math
import os
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from _results import (  # noqa: E402
    arguments,
    copy_ceiling_tb_s,
    describe_machine,
    kernel_times_us,
    results_dir,
    stream_floor_us,
    write_json,
)

HEADS = {  # name: (Hq, Hkv, D)
    "llama3-8b": (32, 8, 128),
    "smollm2": (9, 3, 64),
    "gpt-oss-20b": (64, 8, 64),
}
SINKS_CONFIG = "gpt-oss-20b"  # also timed with attention sinks ("gpt-oss-20b+sinks")
SWEEP_CONFIGS = ("llama3-8b", "smollm2")
# (B, ctx); batch 1 at 16k is the end-to-end benchmark's batch-1 row (e2e_attn_paged.py), where a decode step's
# attention is a long single-sequence read
ROWS = ((1, 8192), (1, 16384), (16, 8192), (64, 4096), (256, 1024), (8, 32768))
BLOCK_SIZE = 16
TOL = 2e-2  # max abs error vs the fp32 reference (bf16)
# Query scale: logits ~ N(0, Q_STD^2), a softmax peaked enough that the output is O(0.1-1) even at 32k keys, so
# that a kernel reading wrong keys (or half of them, or dropping the sink) misses by >= 4x TOL, while bf16
# rounding (P and the output in bf16) stays <= 2e-3 (simulated, ctx >= 1024). With N(0, 1) queries the output
# at 32k keys is ~N(0, 1/n): half the keys would miss by 1.7x TOL only.
Q_STD = 1.5
IMPLS = ("ours", "fa3", "triton")
LABELS = {"ours": "infera", "fa3": "FA3 (vLLM)", "triton": "vLLM Triton"}

# vLLM 0.26 constants (cited from its sources)
FA3_MAX_NUM_SPLITS = 32  # config/attention.py: flash_attn_max_num_splits_for_cuda_graph = 32
MIN_LAUNCH_GRID_SIZE_2D = 128  # v1/attention/backends/triton_attn.py
NUM_PAR_SOFTMAX_SEGMENTS = 16  # v1/attention/backends/triton_attn.py

L2_BYTES = 50 * 2**20  # H100/H200 (as tune_norm.py); the cold mode cycles over >= 4x this
MAX_KV_COPIES = 64
REP_MS = 20
SWEEP_REP_MS = 10
SWEEP_BLOCK_N = (32, 64, 128)
SWEEP_WARPS = (4, 8)
SWEEP_STAGES = (1, 2, 3)
TRACEBACK = False  # --traceback: print a failed call's traceback


# ----------------------------------------------------------------------------------------------------------
# Our package
# ----------------------------------------------------------------------------------------------------------

def import_ours():
    """(launch, reference, where): the installed infera-attn-paged wheel, and where it is installed."""
    from infera_ops.attn_paged import launch, reference

    return launch, reference, os.path.dirname(launch.__file__)


# ----------------------------------------------------------------------------------------------------------
# Cases: the KV cache as vLLM 0.26 lays it out, block tables, queries, sinks, the reference
# ----------------------------------------------------------------------------------------------------------

def build_kv_cache(num_blocks: int, num_kv_heads: int, head_size: int, *, block_size: int = BLOCK_SIZE,
                   dtype=torch.bfloat16, device="cuda") -> torch.Tensor:
    """vLLM 0.26's packed KV cache of one layer, N(0, 1): logical shape (num_blocks, Hkv, block_size, 2·D)
    (TritonAttentionBackend / FlashAttentionBackend.get_kv_cache_shape) over the NHD physical layout (their
    get_kv_cache_stride_order (0, 2, 1, 3)): allocated as [num_blocks, block_size, Hkv, 2·D], then permuted."""
    phys = torch.empty(num_blocks, block_size, num_kv_heads, 2 * head_size, dtype=dtype, device=device)
    phys.normal_()
    return phys.permute(0, 2, 1, 3)


def split_kv(kv: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What both backends' forward do: (num_blocks, Hkv, bs, 2D) -> key, value views [num_blocks, bs, Hkv, D]."""
    key_cache, value_cache = kv.transpose(1, 2).split(head_size, dim=-1)
    return key_cache, value_cache


def random_block_table(batch: int, pages: int, num_blocks: int, device) -> torch.Tensor:
    """[batch, pages] int32: a random permutation of the blocks (every block used once when num_blocks =
    batch x pages)."""
    perm = torch.randperm(num_blocks)[: batch * pages]
    return perm.view(batch, pages).to(torch.int32).to(device)


def make_sinks(num_heads: int, ctx: int, device) -> torch.Tensor:
    """[Hq] fp32 sink logits, bf16-representable (FA3 takes them as bf16, ours and Triton as fp32: the same
    values), around the log-sum-exp of the logits (log ctx + Q_STD²/2) so that they take a real share of
    the probability mass (10-90%): a kernel ignoring them fails the check."""
    s = math.log(ctx) + Q_STD**2 / 2 + torch.randn(num_heads)
    return s.to(torch.bfloat16).float().to(device)


@dataclass
class Case:
    config: str
    Hq: int
    Hkv: int
    D: int
    B: int
    ctx: int
    q: torch.Tensor  # [B, Hq, D]
    kvs: list  # packed caches (logical (num_blocks, Hkv, bs, 2D)); kvs[1:] are clones of kvs[0] (L2 rotation)
    keys: list  # key_cache views, one per copy
    values: list
    block_table: torch.Tensor  # [B, pages] int32
    seq_lens: torch.Tensor  # [B] int32, all ctx
    cu_seqlens_q: torch.Tensor  # [B + 1] int32: arange (one query token per sequence)
    scale: float

    @property
    def kv_bytes(self) -> int:
        """KV bytes a decode step reads: B·ctx·Hkv·D·2 (K and V)·2 (bf16)."""
        return self.B * self.ctx * self.Hkv * self.D * 2 * self.q.element_size()

    @property
    def device(self):
        return self.q.device

    def stream_floor_calls(self) -> list:
        """The pages a decode step reads, as _results.stream_floor_us takes them: one launch per KV copy
        (the graph cycles over the copies, as it does for the kernels), each page's K and V of every KV head
        one region (vLLM's layout: a block's bs x Hkv x 2D elements are contiguous)."""
        _, Hkv, bs, d2 = self.kvs[0].shape
        pages = self.block_table.flatten()
        return [[[(kv, pages, bs * Hkv * d2)]] for kv in self.kvs]


def kv_copies_for(B: int, ctx: int, Hkv: int, D: int, cold: bool) -> int:
    if not cold:
        return 1
    per_copy = B * ctx * Hkv * D * 2 * 2
    return max(1, min(MAX_KV_COPIES, -(-4 * L2_BYTES // per_copy)))


def make_case(config: str, Hq: int, Hkv: int, D: int, B: int, ctx: int, *, device, dtype=torch.bfloat16,
              copies: int = 1, block_size: int = BLOCK_SIZE) -> Case:
    pages = -(-ctx // block_size)
    num_blocks = B * pages
    kv0 = build_kv_cache(num_blocks, Hkv, D, block_size=block_size, dtype=dtype, device=device)
    kvs = [kv0] + [kv0.clone() for _ in range(copies - 1)]  # clone keeps the (permuted) strides
    for kv in kvs:
        assert kv.stride() == kv0.stride() and kv.transpose(1, 2).is_contiguous()
    keys, values = zip(*(split_kv(kv, D) for kv in kvs))
    q = (torch.randn(B, Hq, D, device=device) * Q_STD).to(dtype)
    return Case(config=config, Hq=Hq, Hkv=Hkv, D=D, B=B, ctx=ctx, q=q, kvs=kvs, keys=list(keys),
                values=list(values), block_table=random_block_table(B, pages, num_blocks, device),
                seq_lens=torch.full((B,), ctx, dtype=torch.int32, device=device),
                cu_seqlens_q=torch.arange(B + 1, dtype=torch.int32, device=device), scale=D**-0.5)


def check_layout(case: Case) -> None:
    """The views are vLLM's: [num_blocks, bs, Hkv, D], strides (bs·Hkv·2D, Hkv·2D, 2D, 1), V at +D."""
    k, v, kv = case.keys[0], case.values[0], case.kvs[0]
    nb, bs, H, D = k.shape
    assert kv.shape == (nb, H, bs, 2 * D), kv.shape
    assert (H, D) == (case.Hkv, case.D) and v.shape == k.shape
    assert k.stride() == (bs * H * 2 * D, H * 2 * D, 2 * D, 1) == v.stride(), (k.stride(), v.stride())
    assert v.data_ptr() - k.data_ptr() == D * k.element_size()


def reference_out(reference, case: Case, sinks=None) -> torch.Tensor:
    return reference.paged_decode_reference(case.q, case.keys[0], case.values[0], case.block_table,
                                            case.seq_lens, case.scale, sinks=sinks)


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Max abs error over every sequence, head and channel; NaN (e.g. an output left unwritten) stays NaN."""
    diff = (out.float() - ref).abs()
    if torch.isnan(diff).any():
        return float("nan")
    return diff.max().item()


def is_ok(err) -> bool:
    return err is not None and math.isfinite(err) and err < TOL


# ----------------------------------------------------------------------------------------------------------
# Implementations: each is a run(i) that computes the case on KV copy i into its own output
# ----------------------------------------------------------------------------------------------------------

@dataclass
class Impl:
    run: object
    out: torch.Tensor
    info: dict = field(default_factory=dict)


def make_ours(launch, case: Case, sinks=None, *, config=None, policy=None, pdl=None) -> Impl:
    """Ours as the backend runs it: the device's decode defaults (its tuning file, INFERA_ATTN_PAGED_TUNING,
    or launch.py's), each of which a sweep candidate may replace."""
    cfg0, policy0, pdl0 = launch.decode_defaults(case.D, case.device)
    policy, cfg = policy or policy0, config or cfg0
    splits = launch.split_cap(case.B, case.Hkv, case.device, policy)  # the slice cap, as the metadata builder
    # preallocated as vLLM's metadata builder does: nothing is allocated during graph capture
    # (Workspace rows are (sequence, slice) pairs: B·cap)
    ws = launch.Workspace(case.B * splits, case.Hq, case.D, case.device, max_splits=splits)
    out = torch.empty_like(case.q)
    use_pdl = pdl0 if pdl is None else pdl

    def run(i: int) -> None:
        launch.paged_decode(case.q, case.keys[i], case.values[i], case.block_table, case.seq_lens, case.scale, out,
                            sinks=sinks, num_splits=splits, workspace=ws, config=cfg, policy=policy, pdl=use_pdl)

    # the slices each sequence takes (every sequence of a case has the same length)
    used = int(launch.slices_per_sequence(case.seq_lens[:1].cpu(), splits, policy=policy)[0])
    return Impl(run, out, {"splits": used, "split_cap": splits, "config": asdict(cfg), "policy": asdict(policy),
                           "pdl": use_pdl})


def fa3_status() -> tuple[bool, str | None]:
    try:
        from vllm.vllm_flash_attn.flash_attn_interface import fa_version_unsupported_reason, is_fa_version_supported
    except Exception as exc:  # noqa: BLE001
        return False, f"vllm.vllm_flash_attn: {exc}"
    if not is_fa_version_supported(3):
        return False, str(fa_version_unsupported_reason(3))
    return True, None


def fa3_scheduler_kwargs(case, *, max_seqlen_q: int = 1, num_splits: int = FA3_MAX_NUM_SPLITS) -> dict:
    """FlashAttentionMetadataBuilder.build -> schedule() -> get_scheduler_metadata (window (-1, -1); no softcap
    argument). Defaults: a uniform decode batch under full CUDA graphs (num_splits = max_num_splits); the
    prefill section passes max_seqlen_q = the longest query and num_splits = fa3_builder_num_splits(T).
    ``case.B`` is the number of requests, ``case.ctx`` the longest sequence (max_seq_len)."""
    return dict(batch_size=case.B, max_seqlen_q=max_seqlen_q, max_seqlen_k=case.ctx, num_heads_q=case.Hq,
                num_heads_kv=case.Hkv, headdim=case.D, cache_seqlens=case.seq_lens, qkv_dtype=case.q.dtype,
                cu_seqlens_q=case.cu_seqlens_q, page_size=case.keys[0].shape[1], causal=True,
                window_size=(-1, -1), num_splits=num_splits)


def fa3_call_kwargs(case, i: int, out, scheduler_metadata, descales, s_aux, *, max_seqlen_q: int = 1,
                    num_splits: int = FA3_MAX_NUM_SPLITS) -> dict:
    """FlashAttentionImpl.forward's flash_attn_varlen_func call (no cascade, no DCP)."""
    q_descale, k_descale, v_descale = descales
    return dict(q=case.q, k=case.keys[i], v=case.values[i], out=out, cu_seqlens_q=case.cu_seqlens_q,
                max_seqlen_q=max_seqlen_q, seqused_k=case.seq_lens, max_seqlen_k=case.ctx, softmax_scale=case.scale,
                causal=True, alibi_slopes=None, window_size=[-1, -1], block_table=case.block_table, softcap=0,
                scheduler_metadata=scheduler_metadata, fa_version=3, q_descale=q_descale, k_descale=k_descale,
                v_descale=v_descale, num_splits=num_splits, s_aux=s_aux)


def unit_scales(case):
    """layer._q_scale / _k_scale / _v_scale (0-dim fp32 ones) expanded to (num_seqs, Hkv) as forward does."""
    shape = (case.cu_seqlens_q.shape[0] - 1, case.keys[0].shape[2])
    return tuple(torch.tensor(1.0, dtype=torch.float32, device=case.device).expand(shape) for _ in range(3))


def make_fa3(case, sinks=None, *, max_seqlen_q: int = 1, num_splits: int = FA3_MAX_NUM_SPLITS) -> Impl:
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    lens = dict(max_seqlen_q=max_seqlen_q, num_splits=num_splits)
    sched = get_scheduler_metadata(**fa3_scheduler_kwargs(case, **lens))
    descales = unit_scales(case)
    s_aux = sinks.to(torch.bfloat16).contiguous() if sinks is not None else None  # FA3 checks bf16 s_aux
    out = torch.empty_like(case.q)

    def run(i: int) -> None:
        flash_attn_varlen_func(**fa3_call_kwargs(case, i, out, sched, descales, s_aux, **lens))

    return Impl(run, out, {"num_splits": num_splits, "scheduler_metadata": int(sched.numel())})


def triton_buffers(case) -> dict:
    """TritonAttentionMetadataBuilder.__init__: seq_threshold_3D = MIN_LAUNCH_GRID_SIZE_2D // Hkv (vLLM snaps it
    to the nearest CUDA-graph capture size; not here) and the 3D kernel's fp32 segment buffers."""
    import triton

    thr = MIN_LAUNCH_GRID_SIZE_2D // case.Hkv
    segs = NUM_PAR_SOFTMAX_SEGMENTS
    f32 = dict(dtype=torch.float32, device=case.device)
    return dict(seq_threshold_3D=thr, num_par_softmax_segments=segs,
                softmax_segm_output=torch.empty(thr, case.Hq, segs, triton.next_power_of_2(case.D), **f32),
                softmax_segm_max=torch.empty(thr, case.Hq, segs, **f32),
                softmax_segm_expsum=torch.empty(thr, case.Hq, segs, **f32))


def triton_call_kwargs(case, i: int, out, buffers: dict, k_descale, v_descale, sinks, *,
                       max_seqlen_q: int = 1) -> dict:
    """TritonAttentionImpl.forward's unified_attention call (bf16 cache: q_descale None, no fp8, no TD)."""
    return dict(q=case.q, k=case.keys[i], v=case.values[i], out=out, cu_seqlens_q=case.cu_seqlens_q,
                max_seqlen_q=max_seqlen_q, seqused_k=case.seq_lens, max_seqlen_k=case.ctx, softmax_scale=case.scale,
                causal=True, alibi_slopes=None, use_alibi_sqrt=False, window_size=(-1, -1),
                block_table=case.block_table, softcap=0, q_descale=None, k_descale=k_descale,
                v_descale=v_descale, **buffers, sinks=sinks, output_scale=None, mm_prefix_range=None,
                rswa_prefix_lens=None, rswa_window=None, chunk_lookback=-1, use_td=False,
                mm_prefix_clamp_sliding_window=False)


def make_triton(case, sinks=None, *, max_seqlen_q: int = 1) -> Impl:
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    buffers = triton_buffers(case)
    _, k_descale, v_descale = unit_scales(case)
    out = torch.empty_like(case.q)

    def run(i: int) -> None:
        unified_attention(**triton_call_kwargs(case, i, out, buffers, k_descale, v_descale, sinks,
                                               max_seqlen_q=max_seqlen_q))

    # unified_attention: the 3D kernel only for decode-only batches up to the threshold (max_seqlen_q > 1: 2D)
    path = "3D" if max_seqlen_q == 1 and case.B <= buffers["seq_threshold_3D"] else "2D"
    return Impl(run, out, {"path": path, "seq_threshold_3D": buffers["seq_threshold_3D"]})


# ----------------------------------------------------------------------------------------------------------
# Measuring
# ----------------------------------------------------------------------------------------------------------

def short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def graph_us(impl: Impl, copies: int, rep: int) -> float:
    """Median µs per call from do_bench_cudagraph; the calls recorded in the graph cycle over the KV copies."""
    from triton.testing import do_bench_cudagraph

    order = itertools.cycle(range(copies))
    torch.cuda.synchronize()
    return do_bench_cudagraph(lambda: impl.run(next(order)), rep=rep, return_mode="median") * 1e3


def eager_us(impl: Impl, rep: int) -> float:
    """Median µs per eager call (triton.testing.do_bench: launch overhead included, L2 flushed between calls)."""
    from triton.testing import do_bench

    torch.cuda.synchronize()
    return do_bench(lambda: impl.run(0), rep=rep, return_mode="median") * 1e3


def measure(factory, case, ref: torch.Tensor, *, copies: int, rep: int, timed: bool = True, errfn=None,
            okfn=None, eager_fallback: bool = False) -> dict:
    """Build, run once eagerly (compiles; checked), time from graph replays, check the replays' output.
    errfn(out, ref) -> float and okfn(err) -> bool: the check (default max abs error < TOL). eager_fallback:
    where the graph capture fails, time eager calls instead (``timing`` says which; the output is checked
    after them the same way)."""
    errfn, okfn = errfn or max_err, okfn or is_ok
    res = {"us": None, "err": None, "err_graph": None, "ok": False, "error": None, "info": {}, "timing": None}
    stage = "setup"
    try:
        impl = factory()
        res["info"] = impl.info
        stage = "eager"
        impl.out.fill_(float("nan"))  # an output the kernel does not write fails the check
        impl.run(0)
        if case.device.type == "cuda":
            torch.cuda.synchronize()
        res["err"] = errfn(impl.out, ref)
        ok = okfn(res["err"])
        if timed:
            stage = "graph"
            impl.out.fill_(float("nan"))
            try:
                res["us"] = graph_us(impl, copies, rep)
                res["timing"] = "cudagraph"
            except Exception as exc:  # noqa: BLE001
                if not eager_fallback:
                    raise
                torch.cuda.synchronize()
                stage = "eager timing"
                res["timing"] = f"eager do_bench (graph capture failed: {short(exc)})"
                impl.out.fill_(float("nan"))
                res["us"] = eager_us(impl, rep)
            res["err_graph"] = errfn(impl.out, ref)
            ok = ok and okfn(res["err_graph"])
        res["ok"] = ok
    except Exception as exc:  # noqa: BLE001
        res["error"] = f"{stage}: {short(exc)}"
        if TRACEBACK:
            traceback.print_exc()
        if case.device.type == "cuda":
            try:
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001
                pass
    return res


def pct(nbytes: int, us, ceiling: float):
    return None if us is None else nbytes / (us * 1e-6) / 1e12 / ceiling * 100


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def bench_row(launch, reference, case: Case, sinks, label: str, ceiling: float, copies: int, fa3_ok: bool) -> dict:
    ref = reference_out(reference, case, sinks)
    factories = {
        "ours": lambda: make_ours(launch, case, sinks),
        "fa3": (lambda: make_fa3(case, sinks)) if fa3_ok else None,
        "triton": lambda: make_triton(case, sinks),
    }
    row = {"config": label, "Hq": case.Hq, "Hkv": case.Hkv, "D": case.D, "sinks": sinks is not None,
           "B": case.B, "ctx": case.ctx, "bytes": case.kv_bytes, "kv_copies": copies,
           "floor_us": case.kv_bytes / (ceiling * 1e12) * 1e6,
           "stream_floor_us": stream_floor_us(case.stream_floor_calls())}
    for name, factory in factories.items():
        if factory is None:
            res = {"us": None, "err": None, "err_graph": None, "ok": None, "error": "unavailable", "info": {}}
        else:
            res = measure(factory, case, ref, copies=copies, rep=REP_MS)
        row[f"{name}_us"] = res["us"]
        row[f"{name}_err"] = res["err"]
        row[f"{name}_err_graph"] = res["err_graph"]
        row[f"{name}_ok"] = res["ok"]
        row[f"{name}_error"] = res["error"]
        row[f"{name}_info"] = res["info"]
        row[f"{name}_pct_copy"] = pct(case.kv_bytes, res["us"], ceiling)
    row["speedup_vs_fa3"] = ratio(row["fa3_us"], row["ours_us"])
    row["ours_pct_stream_floor"] = None if row["ours_us"] is None else row["stream_floor_us"] / row["ours_us"] * 100
    if row["ours_ok"]:  # each of our kernels' GPU time per call (the decode kernel, the reduce where it runs)
        impl = make_ours(launch, case, sinks)
        row["ours_kernels_us"] = kernel_times_us(lambda: [impl.run(i) for i in range(copies)], calls=copies)
    row["speedup_vs_triton"] = ratio(row["triton_us"], row["ours_us"])
    row["ours_splits"] = row["ours_info"].get("splits")
    row["triton_path"] = row["triton_info"].get("path")
    del ref
    return row


def fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


def ok_flag(row: dict, name: str) -> str:
    ok = row[f"{name}_ok"]
    if ok is None:
        return "n/a"
    if ok:
        return "ok"
    return "ERR" if row[f"{name}_error"] else "BAD"


def print_row(row: dict) -> None:
    parts = [f"{row['config']:<18} B={row['B']:<4} ctx={row['ctx']:<6}"]
    for name in IMPLS:
        parts.append(f"{name} {fmt(row[f'{name}_us'], '8.1f')} us ({fmt(row[f'{name}_pct_copy'], '5.1f')}%, "
                     f"err {fmt(row[f'{name}_err'], '.1e')}, {ok_flag(row, name)})")
    line = (" | ".join(parts) + f" | splits {row['ours_splits']} triton {row['triton_path']} | stream floor "
            f"{row['stream_floor_us']:.1f} us | kernels "
            + ", ".join(f"{k[:28]} {v:.1f}" for k, v in (row.get("ours_kernels_us") or {}).items()))
    print(line, flush=True)
    for name in IMPLS:
        if row[f"{name}_error"] and row[f"{name}_error"] != "unavailable":
            print(f"    {name}: {row[f'{name}_error']}", flush=True)


HEADER = (f"{'config':<18} {'B':>4} {'ctx':>6} {'ours us':>9} {'FA3 us':>9} {'triton us':>9} {'xFA3':>6} "
          f"{'xtriton':>7} {'ours%':>6} {'FA3%':>6} {'tri%':>6}  {'ok ours/FA3/tri':<16} splits")


def print_table(rows: list, ceiling: float) -> list:
    print(f"\ncopy ceiling {ceiling:.2f} TB/s; % = KV bytes / time / ceiling; x = other_us / ours_us (>1: ours "
          f"faster)")
    print(HEADER)
    print("-" * len(HEADER))
    bad = []
    for r in rows:
        flags = "/".join(ok_flag(r, n) for n in IMPLS)
        print(f"{r['config']:<18} {r['B']:>4} {r['ctx']:>6} {fmt(r['ours_us'], '9.1f'):>9} "
              f"{fmt(r['fa3_us'], '9.1f'):>9} {fmt(r['triton_us'], '9.1f'):>9} "
              f"{fmt(r['speedup_vs_fa3'], '6.2f'):>6} {fmt(r['speedup_vs_triton'], '7.2f'):>7} "
              f"{fmt(r['ours_pct_copy'], '6.1f'):>6} {fmt(r['fa3_pct_copy'], '6.1f'):>6} "
              f"{fmt(r['triton_pct_copy'], '6.1f'):>6}  {flags:<16} {r['ours_splits']} "
              f"(FA3 <={FA3_MAX_NUM_SPLITS}, triton {r['triton_path']})")
        for n in IMPLS:
            if r[f"{n}_ok"] is False:
                bad.append((r, n))
    if bad:
        print("\n" + "!" * 100)
        for r, n in bad:
            what = r[f"{n}_error"] or (f"max abs err eager {fmt(r[f'{n}_err'], '.3e')}, after graph replays "
                                        f"{fmt(r[f'{n}_err_graph'], '.3e')} (tolerance {TOL})")
            print(f"!!! WRONG/FAILED: {n} {r['config']} B={r['B']} ctx={r['ctx']}: {what}")
        print("!" * 100)
    return bad


def sink_overheads(rows: list) -> list:
    base = {(r["B"], r["ctx"]): r for r in rows if r["config"] == SINKS_CONFIG}
    out = []
    for r in rows:
        if r["config"] != SINKS_CONFIG + "+sinks" or (r["B"], r["ctx"]) not in base:
            continue
        b = base[(r["B"], r["ctx"])]
        out.append({"B": r["B"], "ctx": r["ctx"],
                    **{f"{n}_sinks_over_plain": ratio(r[f"{n}_us"], b[f"{n}_us"]) for n in IMPLS}})
    if out:
        print(f"\nsink overhead ({SINKS_CONFIG}, time with sinks / without): "
              + "; ".join(f"B={o['B']} ctx={o['ctx']}: " + " ".join(
                  f"{n} {fmt(o[f'{n}_sinks_over_plain'], '.3f')}" for n in IMPLS) for o in out))
    return out


# ----------------------------------------------------------------------------------------------------------
# Sweep (--sweep)
# ----------------------------------------------------------------------------------------------------------

SWEEP_PROGRAMS_PER_SM = (4, 8, 16, 32, 64)
SWEEP_SPLIT_KEYS = (64, 128, 256, 512)


def sweep_case(launch, reference, case: Case, copies: int, deadline: float, *, timed: bool = True,
               stages=SWEEP_STAGES) -> dict:
    """Three passes, each from the best of the last: launch configs (block_n x warps x stages) under the
    default split policy and PDL; split policies (programs_per_sm x split_keys); PDL off."""
    ref = reference_out(reference, case)
    default = launch.decode_defaults(case.D, case.device)
    results, failed, wrong, skipped = [], [], [], 0

    def run(cands):
        nonlocal skipped
        for cfg, pol, pdl in cands:
            if any(e["key"] == (cfg, pol, pdl) for e in results):
                continue
            if time.time() > deadline:
                skipped += 1
                continue
            res = measure(lambda: make_ours(launch, case, config=cfg, policy=pol, pdl=pdl), case, ref, copies=copies,
                          rep=SWEEP_REP_MS, timed=timed)
            entry = {"key": (cfg, pol, pdl), "config": asdict(cfg), "policy": asdict(pol), "pdl": pdl,
                     "splits": res["info"].get("splits"), "us": res["us"], "err": res["err"], "ok": res["ok"]}
            if res["error"]:
                entry["error"] = res["error"]
                failed.append(entry)
            elif not res["ok"]:
                wrong.append(entry)
            results.append(entry)
        good = [e for e in results if e["ok"] and e["us"] is not None]
        return min(good, key=lambda e: e["us"])["key"] if good else default

    cfg, pol, pdl = run([(launch.LaunchConfig(block_n=bn, num_warps=w, num_stages=st), default[1], default[2])
                         for bn, w, st in itertools.product(SWEEP_BLOCK_N, SWEEP_WARPS, stages)] + [default])
    cfg, pol, pdl = run([(cfg, launch.SplitPolicy(programs_per_sm=p, split_keys=k), pdl)
                         for p, k in itertools.product(SWEEP_PROGRAMS_PER_SM, SWEEP_SPLIT_KEYS)])
    run([(cfg, pol, not pdl)] if default[2] else [])
    for e in results:
        e.pop("key")
    good = [e for e in results if e["ok"] and e["us"] is not None]
    best = min(good, key=lambda e: e["us"]) if good else None
    dflt = next((e for e in results if e["config"] == asdict(default[0]) and e["policy"] == asdict(default[1])
                 and e["pdl"] == default[2]), None)
    out = {"config": case.config, "B": case.B, "ctx": case.ctx, "best": best, "default": dflt,
           "gain_vs_default": ratio(dflt["us"] if dflt else None, best["us"] if best else None),
           "n_candidates": len(results) + skipped, "n_failed_to_run": len(failed), "n_wrong": len(wrong),
           "n_skipped_budget": skipped, "failed": failed, "wrong": wrong, "candidates": results}

    def describe(e):
        c, p = e["config"], e["policy"]
        return (f"block_n={c['block_n']} warps={c['num_warps']} stages={c['num_stages']} "
                f"pps={p['programs_per_sm']} split_keys={p['split_keys']} pdl={int(e['pdl'])} "
                f"splits={e['splits']} {e['us']:.1f} us")

    print(f"sweep {case.config:<10} B={case.B:<4} ctx={case.ctx:<6} best " + (describe(best) if best else "none")
          + (f" | default {describe(dflt)}" if dflt and dflt["us"] else "")
          + (f" | x{out['gain_vs_default']:.3f}" if out["gain_vs_default"] else "")
          + (f" | {len(failed)} failed to compile/run (skipped)" if failed else "")
          + (f" | {len(wrong)} WRONG" if wrong else "")
          + (f" | {skipped} not run (time budget)" if skipped else ""), flush=True)
    for e in failed[:3]:
        print(f"    skipped {e['config']} {e['policy']}: {e['error']}", flush=True)
    for e in wrong:
        print(f"    !!! WRONG {e['config']} {e['policy']} pdl={e['pdl']}: err {fmt(e['err'], '.3e')}", flush=True)
    return out


# ----------------------------------------------------------------------------------------------------------
# Plot
# ----------------------------------------------------------------------------------------------------------

def plot(rows: list, ceiling: float, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(2, len(configs), figsize=(4.6 * len(configs), 7.2), squeeze=False)
    width = 0.27
    for col, name in enumerate(configs):
        sel = [r for r in rows if r["config"] == name]
        labels = [f"B{r['B']}\n{r['ctx'] // 1024}k" if r["ctx"] % 1024 == 0 else f"B{r['B']}\n{r['ctx']}" for r in sel]
        xs = range(len(sel))
        top, bottom = axes[0][col], axes[1][col]
        nan = float("nan")
        for j, impl in enumerate(IMPLS):
            us = [r[f"{impl}_us"] if r[f"{impl}_us"] is not None else nan for r in sel]
            pc = [r[f"{impl}_pct_copy"] if r[f"{impl}_pct_copy"] is not None else nan for r in sel]
            off = [x + (j - 1) * width for x in xs]
            top.bar(off, us, width, label=LABELS[impl], color=f"C{j}")
            bottom.bar(off, pc, width, label=LABELS[impl], color=f"C{j}")
            for x, r, u, p in zip(off, sel, us, pc):
                if r[f"{impl}_ok"] is False:  # a wrong or failed result: marked on both plots
                    top.annotate("BAD", (x, u if math.isfinite(u) else r["floor_us"]), ha="center", va="bottom",
                                 color="red", fontsize=7, rotation=90)
                    bottom.annotate("BAD", (x, p if math.isfinite(p) else 1.0), ha="center", va="bottom",
                                    color="red", fontsize=7, rotation=90)
        top.plot(list(xs), [r["floor_us"] for r in sel], "k--", marker="_", markersize=14,
                 label="floor: KV bytes / copy ceiling")
        top.plot(list(xs), [r["stream_floor_us"] for r in sel], "k:", marker="_", markersize=14,
                 label="stream floor: the same pages read alone")
        bottom.axhline(100, color="k", ls="--", label=f"copy ceiling {ceiling:.2f} TB/s")
        top.set_yscale("log")
        top.set_title(f"{name} (Hq {sel[0]['Hq']}, Hkv {sel[0]['Hkv']}, D {sel[0]['D']})", fontsize=9)
        top.set_ylabel("µs per call (log)")
        bottom.set_ylabel("% of copy bandwidth")
        for ax in (top, bottom):
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, fontsize=7)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle("paged decode attention, bf16, block 16: infera vs vLLM 0.26 FA3 / Triton (CUDA-graph replays)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------------------
# Prefill (on by default; --no-prefill skips): ragged causal attention over the paged cache
# ----------------------------------------------------------------------------------------------------------

PREFILL_CONFIGS = ("llama3-8b", "smollm2")
# (kind, label, ((context, new tokens) per request)). Mixed: the decodes first (vLLM's scheduler takes the
# running requests before the new one).
PREFILL_CASES = (
    ("prefill", "1x4096", ((0, 4096),)),
    ("prefill", "8x1024", ((0, 1024),) * 8),
    ("prefill", "32x256", ((0, 256),) * 32),
    ("chunked", "4x512@7680", ((7680, 512),) * 4),
    ("mixed", "2048+63x1@2048", ((2048, 1),) * 63 + ((0, 2048),)),
)
PREFILL_ATOL = PREFILL_RTOL = 2e-2  # torch.testing.assert_close's style: |out - ref| <= atol + rtol·|ref|
PEAK_BF16_TFLOPS = 790.0  # the dense bf16 ceiling drawn in the figure (NVIDIA's H200 SXM datasheet: 989 at boost)
PREFILL_REP_MS = 20
# vLLM 0.26 (config/compilation.py): max_cudagraph_capture_size defaults to min(2·max_num_seqs, 512)
MAX_CUDAGRAPH_CAPTURE_SIZE = 512


@dataclass
class PrefillCase:
    config: str
    kind: str  # prefill | chunked | mixed
    label: str
    Hq: int
    Hkv: int
    D: int
    context: tuple  # cached tokens per request
    new: tuple  # new (query) tokens per request
    q: torch.Tensor  # [T, Hq, D]
    kvs: list  # one packed cache (logical (num_blocks, Hkv, bs, 2D), NHD physical)
    keys: list
    values: list
    block_table: torch.Tensor  # [R, pages] int32
    seq_lens: torch.Tensor  # [R] int32: context + new
    query_start_loc: torch.Tensor  # [R + 1] int32: cumulative new tokens
    scale: float

    # the names the decode helpers (fa3_scheduler_kwargs, fa3_call_kwargs, triton_*, unit_scales) read
    @property
    def B(self) -> int:  # requests
        return len(self.new)

    @property
    def ctx(self) -> int:  # max_seq_len
        return max(c + n for c, n in zip(self.context, self.new))

    @property
    def cu_seqlens_q(self) -> torch.Tensor:
        return self.query_start_loc

    @property
    def max_seqlen_q(self) -> int:  # max_query_len
        return max(self.new)

    @property
    def T(self) -> int:
        return sum(self.new)

    @property
    def device(self):
        return self.q.device

    @property
    def flops(self) -> int:
        """4·D·Hq·(keys visible to each query token, causal): token i of a request with c cached tokens sees
        c + i + 1 keys (QK^T and PV, 2 FLOPs per multiply-add each)."""
        visits = sum(n * c + n * (n + 1) // 2 for c, n in zip(self.context, self.new))
        return 4 * self.D * self.Hq * visits


def make_prefill_case(config: str, kind: str, label: str, Hq: int, Hkv: int, D: int, reqs, *, device,
                      dtype=torch.bfloat16, block_size: int = BLOCK_SIZE) -> PrefillCase:
    """vLLM's inputs for one ragged batch: the packed cache (build_kv_cache / split_kv, as the decode section;
    the new tokens' K/V are already in it: random like the rest), a random block table, q N(0, Q_STD²)."""
    context = tuple(int(c) for c, _ in reqs)
    new = tuple(int(n) for _, n in reqs)
    lens = [c + n for c, n in zip(context, new)]
    R = len(reqs)
    pages = -(-max(lens) // block_size)
    num_blocks = R * pages
    kv = build_kv_cache(num_blocks, Hkv, D, block_size=block_size, dtype=dtype, device=device)
    key_cache, value_cache = split_kv(kv, D)
    q = (torch.randn(sum(new), Hq, D, device=device) * Q_STD).to(dtype)
    qsl = torch.tensor([0, *itertools.accumulate(new)], dtype=torch.int32, device=device)
    return PrefillCase(config=config, kind=kind, label=label, Hq=Hq, Hkv=Hkv, D=D, context=context, new=new, q=q,
                       kvs=[kv], keys=[key_cache], values=[value_cache],
                       block_table=random_block_table(R, pages, num_blocks, device),
                       seq_lens=torch.tensor(lens, dtype=torch.int32, device=device), query_start_loc=qsl,
                       scale=D**-0.5)


def prefill_ref(case: PrefillCase, **kw) -> torch.Tensor:
    from infera_ops.attn_paged.reference import paged_prefill_reference_fast

    return paged_prefill_reference_fast(case.q, case.keys[0], case.values[0], case.block_table, case.seq_lens,
                                  case.query_start_loc, case.scale, **kw)


def tol_ratio(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / (atol + rtol·|ref|) over every token, head and channel: <= 1 passes (assert_close's
    test with atol = rtol = 2e-2); NaN (e.g. an output left unwritten) stays NaN."""
    diff = (out.float() - ref).abs()
    if torch.isnan(diff).any():
        return float("nan")
    return (diff / (PREFILL_ATOL + PREFILL_RTOL * ref.abs())).max().item()


def tol_ok(ratio_) -> bool:
    return ratio_ is not None and math.isfinite(ratio_) and ratio_ <= 1.0


def fa3_builder_num_splits(num_tokens: int, full_cuda_graph: bool = True) -> int:
    """FlashAttentionMetadataBuilder.build (v1/attention/backends/flash_attn.py:489-499): max_num_splits =
    flash_attn_max_num_splits_for_cuda_graph (32) only with full CUDA graphs enabled (FULL_AND_PIECEWISE, the
    default) AND num_actual_tokens <= max_cudagraph_capture_size; else 0 (FA3's own heuristic). Every timed
    prefill batch here has > 512 tokens: 0, the value get_scheduler_metadata and the call both receive."""
    return FA3_MAX_NUM_SPLITS if full_cuda_graph and num_tokens <= MAX_CUDAGRAPH_CAPTURE_SIZE else 0


def make_ours_prefill(launch, case: PrefillCase) -> Impl:
    out = torch.empty_like(case.q)

    def run(i: int) -> None:
        launch.paged_prefill(case.q, case.keys[i], case.values[i], case.block_table, case.seq_lens,
                             case.query_start_loc, case.scale, out)

    info = {}
    try:
        block_m, cfg = launch.prefill_config(case.D, case.Hq // case.Hkv)
        info = {"block_m": block_m, "config": asdict(cfg)}
    except Exception:  # noqa: BLE001  (informational only)
        pass
    return Impl(run, out, info)


def make_fa3_prefill(case: PrefillCase) -> Impl:
    return make_fa3(case, None, max_seqlen_q=case.max_seqlen_q, num_splits=fa3_builder_num_splits(case.T))


def make_triton_prefill(case: PrefillCase) -> Impl:
    return make_triton(case, None, max_seqlen_q=case.max_seqlen_q)


def prefill_row(launch, case: PrefillCase, fa3_ok: bool) -> dict:
    t = time.time()
    ref = prefill_ref(case)
    ref_s = time.time() - t
    factories = {"ours": lambda: make_ours_prefill(launch, case),
                 "fa3": (lambda: make_fa3_prefill(case)) if fa3_ok else None,
                 "triton": lambda: make_triton_prefill(case)}
    row = {"config": case.config, "kind": case.kind, "case": case.label, "Hq": case.Hq, "Hkv": case.Hkv,
           "D": case.D, "R": case.B, "T": case.T, "max_seqlen_q": case.max_seqlen_q, "max_seqlen_k": case.ctx,
           "context": list(case.context), "new": list(case.new), "flops": case.flops,
           "floor_us": case.flops / (PEAK_BF16_TFLOPS * 1e12) * 1e6, "reference_s": ref_s}
    for name, factory in factories.items():
        if factory is None:
            res = {"us": None, "err": None, "err_graph": None, "ok": None, "error": "unavailable", "info": {}}
        else:
            res = measure(factory, case, ref, copies=1, rep=PREFILL_REP_MS, errfn=tol_ratio, okfn=tol_ok,
                          eager_fallback=True)
        row[f"{name}_us"] = res["us"]
        row[f"{name}_err"] = res["err"]  # max |out - ref| / (atol + rtol·|ref|): ok <= 1
        row[f"{name}_err_graph"] = res["err_graph"]
        row[f"{name}_ok"] = res["ok"]
        row[f"{name}_error"] = res["error"]
        row[f"{name}_info"] = res["info"]
        row[f"{name}_timing"] = res.get("timing")
        row[f"{name}_tflops"] = None if res["us"] is None else case.flops / (res["us"] * 1e-6) / 1e12
        if case.device.type == "cuda":
            torch.cuda.empty_cache()
    row["speedup_vs_fa3"] = ratio(row["fa3_us"], row["ours_us"])
    row["speedup_vs_triton"] = ratio(row["triton_us"], row["ours_us"])
    row["triton_path"] = row["triton_info"].get("path")
    row["fa3_num_splits"] = row["fa3_info"].get("num_splits")
    # what the backend runs for this batch by default (INFERA_ATTN_PAGED_PREFILL=auto): FA3 where it runs
    row["route"] = "fa3" if fa3_ok and row["fa3_us"] is not None and case.D % 8 == 0 else "ours"
    row["route_us"] = row[f"{row['route']}_us"]
    row["route_vs_fa3"] = ratio(row["fa3_us"], row["route_us"])
    del ref
    return row


def print_prefill_row(row: dict) -> None:
    parts = [f"{row['config']:<10} {row['case']:<15} T={row['T']:<5}"]
    for name in IMPLS:
        parts.append(f"{name} {fmt(row[f'{name}_us'], '8.1f')} us ({fmt(row[f'{name}_tflops'], '5.1f')} TF/s, "
                     f"err/tol {fmt(row[f'{name}_err'], '.2f')}, {ok_flag(row, name)})")
    print(" | ".join(parts) + f" | triton {row['triton_path']}", flush=True)
    for name in IMPLS:
        if row[f"{name}_error"] and row[f"{name}_error"] != "unavailable":
            print(f"    {name}: {row[f'{name}_error']}", flush=True)
        if row[f"{name}_timing"] not in (None, "cudagraph"):
            print(f"    {name}: timed as {row[f'{name}_timing']}", flush=True)


PREFILL_HEADER = (f"{'config':<10} {'case':<15} {'R':>3} {'T':>5} {'GFLOP':>7} {'route':>5} {'route us':>9} "
                  f"{'ours us':>9} {'FA3 us':>9} "
                  f"{'triton us':>9} {'xFA3':>6} {'xtriton':>7} {'oursTF':>6} {'FA3TF':>6} {'triTF':>6}  "
                  f"{'ok ours/FA3/tri':<16} err/tol ours/FA3/tri")


def print_prefill_table(rows: list) -> list:
    print(f"\nprefill (ragged causal, bf16, block {BLOCK_SIZE}); TF = TFLOP/s (4·D·Hq·causal key visits / time; "
          f"dense bf16 ceiling {PEAK_BF16_TFLOPS:.0f}); x = other_us / ours_us (>1: ours faster); err/tol = max "
          f"|out - ref| / ({PREFILL_ATOL} + {PREFILL_RTOL}·|ref|), ok <= 1")
    print(PREFILL_HEADER)
    print("-" * len(PREFILL_HEADER))
    bad = []
    for r in rows:
        flags = "/".join(ok_flag(r, n) for n in IMPLS)
        errs = "/".join(fmt(r[f"{n}_err"], ".2f") for n in IMPLS)
        print(f"{r['config']:<10} {r['case']:<15} {r['R']:>3} {r['T']:>5} {r['flops'] / 1e9:>7.1f} "
              f"{r['route']:>5} {fmt(r['route_us'], '9.1f'):>9} "
              f"{fmt(r['ours_us'], '9.1f'):>9} {fmt(r['fa3_us'], '9.1f'):>9} {fmt(r['triton_us'], '9.1f'):>9} "
              f"{fmt(r['speedup_vs_fa3'], '6.2f'):>6} {fmt(r['speedup_vs_triton'], '7.2f'):>7} "
              f"{fmt(r['ours_tflops'], '6.1f'):>6} {fmt(r['fa3_tflops'], '6.1f'):>6} "
              f"{fmt(r['triton_tflops'], '6.1f'):>6}  {flags:<16} {errs}")
        for n in IMPLS:
            if r[f"{n}_ok"] is False:
                bad.append((r, n))
    for r in rows:
        for n in IMPLS:
            if r[f"{n}_timing"] not in (None, "cudagraph"):
                print(f"note: {n} {r['config']} {r['case']} timed as {r[f'{n}_timing']}")
    if bad:
        print("\n" + "!" * 100)
        for r, n in bad:
            what = r[f"{n}_error"] or (f"err/tol eager {fmt(r[f'{n}_err'], '.3f')}, after graph replays "
                                        f"{fmt(r[f'{n}_err_graph'], '.3f')} (ok <= 1)")
            print(f"!!! WRONG/FAILED (prefill): {n} {r['config']} {r['case']}: {what}")
        print("!" * 100)
    return bad


def plot_prefill(rows: list, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(2, len(configs), figsize=(5.2 * len(configs), 7.2), squeeze=False)
    width = 0.27
    nan = float("nan")
    for col, name in enumerate(configs):
        sel = [r for r in rows if r["config"] == name]
        labels = [f"{r['kind']}\n{r['case']}" for r in sel]
        xs = range(len(sel))
        top, bottom = axes[0][col], axes[1][col]
        for j, impl in enumerate(IMPLS):
            us = [r[f"{impl}_us"] if r[f"{impl}_us"] is not None else nan for r in sel]
            tf = [r[f"{impl}_tflops"] if r[f"{impl}_tflops"] is not None else nan for r in sel]
            off = [x + (j - 1) * width for x in xs]
            top.bar(off, us, width, label=LABELS[impl], color=f"C{j}")
            bottom.bar(off, tf, width, label=LABELS[impl], color=f"C{j}")
            for x, r, u, t in zip(off, sel, us, tf):
                if r[f"{impl}_ok"] is False:
                    top.annotate("BAD", (x, u if math.isfinite(u) else r["floor_us"]), ha="center", va="bottom",
                                 color="red", fontsize=7, rotation=90)
                    bottom.annotate("BAD", (x, t if math.isfinite(t) else 1.0), ha="center", va="bottom",
                                    color="red", fontsize=7, rotation=90)
        top.plot(list(xs), [r["floor_us"] for r in sel], "k--", marker="_", markersize=14,
                 label=f"floor: FLOPs / {PEAK_BF16_TFLOPS:.0f} TFLOP/s")
        bottom.axhline(PEAK_BF16_TFLOPS, color="k", ls="--", label=f"bf16 dense peak {PEAK_BF16_TFLOPS:.0f} TFLOP/s")
        bottom.set_ylim(0, PEAK_BF16_TFLOPS * 1.1)
        for ax in (top, bottom):
            ax.set_xlim(-0.6, len(sel) - 0.4)
        top.set_yscale("log")
        top.set_title(f"{name} (Hq {sel[0]['Hq']}, Hkv {sel[0]['Hkv']}, D {sel[0]['D']})", fontsize=9)
        top.set_ylabel("µs per call (log)")
        bottom.set_ylabel("TFLOP/s (causal FLOPs)")
        for ax in (top, bottom):
            ax.set_xticks(list(xs))
            ax.set_xticklabels(labels, fontsize=7)
    axes[0][0].legend(fontsize=7)
    axes[1][0].legend(fontsize=7)
    fig.suptitle("paged prefill attention (ragged, causal), bf16, block 16: infera vs vLLM 0.26 FA3 / Triton 2D "
                 "(CUDA-graph replays)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def run_prefill(launch, doc: dict, out_dir: str, fa3_ok: bool, device) -> list:
    """The prefill section on the GPU: a row per (config, case) into doc["prefill"]["rows"], the table, the
    figure; returns the wrong or failed (row, impl) pairs."""
    t0 = time.time()
    sec = doc["prefill"] = {
        "settings": {"configs": {n: HEADS[n] for n in PREFILL_CONFIGS}, "block_size": BLOCK_SIZE,
                     "dtype": "bfloat16", "q_std": Q_STD, "atol": PREFILL_ATOL, "rtol": PREFILL_RTOL,
                     "err": "max |out - ref| / (atol + rtol·|ref|) vs an fp32 gather + masked-matmul reference; "
                            "ok <= 1",
                     "rep_ms": PREFILL_REP_MS, "timing": "triton.testing.do_bench_cudagraph, median; one KV copy "
                     "(warm L2: compute-bound)", "peak_bf16_tflops": PEAK_BF16_TFLOPS,
                     "flops": "4·D·Hq·sum over query tokens of the keys visible to it (causal)",
                     "fa3_num_splits": "fa3_builder_num_splits(T): 0 for every case (> 512 tokens)",
                     "triton": "unified_attention 2D (max_seqlen_q > 1)",
                     "cases": [{"kind": k, "case": lab, "requests_context_new": [list(x) for x in reqs]}
                               for k, lab, reqs in PREFILL_CASES]},
        "rows": []}
    torch.manual_seed(1)
    for name in PREFILL_CONFIGS:
        Hq, Hkv, D = HEADS[name]
        for kind, label, reqs in PREFILL_CASES:
            case = make_prefill_case(name, kind, label, Hq, Hkv, D, reqs, device=device)
            check_layout(case)
            row = prefill_row(launch, case, fa3_ok)
            sec["rows"].append(row)
            print_prefill_row(row)
            del case
            gc.collect()
            torch.cuda.empty_cache()
            write_json(out_dir, "bench_attn_paged", doc)  # partial results survive a timeout
    bad = print_prefill_table(sec["rows"])
    sec["n_wrong_or_failed"] = len(bad)
    sec["seconds"] = time.time() - t0
    path = write_json(out_dir, "bench_attn_paged", doc)
    try:
        plot_prefill(sec["rows"], path.replace(".json", "_prefill.png"))
    except Exception as exc:  # noqa: BLE001
        print(f"prefill plot failed: {short(exc)}")
    print(f"prefill part {sec['seconds']:.0f} s", flush=True)
    return bad


# ----------------------------------------------------------------------------------------------------------
# Main (GPU)
# ----------------------------------------------------------------------------------------------------------

def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--l2", choices=("cold", "warm"), default="cold",
                        help="cold: the calls cycle over KV copies >= 4x the L2; warm: one copy")
    parser.add_argument("--sweep", action="store_true", help="also sweep our launch configs and split counts")
    parser.add_argument("--sweep-budget-s", type=float, default=180.0)
    parser.add_argument("--no-prefill", action="store_true", help="the decode table only")
    parser.add_argument("--traceback", action="store_true", help="print a failed call's traceback")
    args = parser.parse_args()
    global TRACEBACK
    TRACEBACK = args.traceback
    if not torch.cuda.is_available():
        print("bench_attn_paged: needs a CUDA GPU (none found). Its CPU check: "
              "meta/infera-vllm/tests/test_bench_attn_paged.py (nox runs it)", file=sys.stderr)
        return 1
    t0 = time.time()
    launch, reference, ours_from = import_ours()
    machine = describe_machine()
    cold = args.l2 == "cold"
    sweep = args.sweep
    fa3_ok, fa3_reason = fa3_status()
    print(f"ours from {ours_from}; FA3 {'available' if fa3_ok else 'UNAVAILABLE: ' + str(fa3_reason)}; "
          f"L2 {'cold (KV copies cycled, >= 4x L2)' if cold else 'warm (one KV copy)'}", flush=True)
    device = torch.device("cuda")
    ceiling = copy_ceiling_tb_s()
    print(f"copy ceiling {ceiling:.2f} TB/s", flush=True)

    out_dir = args.out or results_dir(machine)
    doc = {"benchmark": "bench_attn_paged", "machine": machine, "copy_ceiling_tb_s": ceiling,
           "ours_from": ours_from, "fa3_available": fa3_ok, "fa3_unavailable_reason": fa3_reason,
           "settings": {"block_size": BLOCK_SIZE, "dtype": "bfloat16", "tolerance_max_abs": TOL, "q_std": Q_STD,
                        "l2": "cold" if cold else "warm", "l2_bytes_assumed": L2_BYTES, "rep_ms": REP_MS,
                        "timing": "triton.testing.do_bench_cudagraph, median",
                        "fa3_num_splits": FA3_MAX_NUM_SPLITS,
                        "triton_seq_threshold_3D": "128 // Hkv (not snapped to a capture size)",
                        "triton_num_par_softmax_segments": NUM_PAR_SOFTMAX_SEGMENTS},
           "rows": []}
    path = None
    torch.manual_seed(0)
    for name, (Hq, Hkv, D) in HEADS.items():
        for B, ctx in ROWS:
            copies = kv_copies_for(B, ctx, Hkv, D, cold)
            case = make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
            check_layout(case)
            row = bench_row(launch, reference, case, None, name, ceiling, copies, fa3_ok)
            doc["rows"].append(row)
            print_row(row)
            if name == SINKS_CONFIG:
                sinks = make_sinks(Hq, ctx, device)
                row = bench_row(launch, reference, case, sinks, name + "+sinks", ceiling, copies, fa3_ok)
                row["sinks_values"] = sinks.tolist()
                doc["rows"].append(row)
                print_row(row)
            del case
            gc.collect()
            torch.cuda.empty_cache()
        path = write_json(out_dir, "bench_attn_paged", doc)  # partial results survive a timeout
    print(f"main part {time.time() - t0:.0f} s", flush=True)

    bad = print_table(doc["rows"], ceiling)
    doc["sink_overhead"] = sink_overheads(doc["rows"])
    doc["n_wrong_or_failed"] = len(bad)
    path = write_json(out_dir, "bench_attn_paged", doc)
    try:
        plot(doc["rows"], ceiling, path.replace(".json", ".png"))
    except Exception as exc:  # noqa: BLE001
        print(f"plot failed: {short(exc)}")

    prefill_bad = []
    if not args.no_prefill:
        print(f"\nprefill: {len(PREFILL_CONFIGS)} configs x {len(PREFILL_CASES)} ragged batches (--no-prefill "
              f"skips)", flush=True)
        prefill_bad = run_prefill(launch, doc, out_dir, fa3_ok, device)
        path = write_json(out_dir, "bench_attn_paged", doc)

    if sweep:
        budget = args.sweep_budget_s
        start = time.time()
        jobs = [(name, B, ctx) for name in SWEEP_CONFIGS for B, ctx in ROWS]
        print(f"\nsweep of our LaunchConfig x splits (budget {budget:.0f} s, shared out over the {len(jobs)} rows; "
              f"candidates that fail to compile or run are skipped and counted)", flush=True)
        doc["sweep"] = []
        doc["sweep_budget_s"] = budget
        for k, (name, B, ctx) in enumerate(jobs):
            Hq, Hkv, D = HEADS[name]
            deadline = start + budget * (k + 1) / len(jobs)  # time a row leaves unused carries over
            copies = kv_copies_for(B, ctx, Hkv, D, cold)
            case = make_case(name, Hq, Hkv, D, B, ctx, device=device, copies=copies)
            doc["sweep"].append(sweep_case(launch, reference, case, copies, deadline))
            del case
            gc.collect()
            torch.cuda.empty_cache()
            path = write_json(out_dir, "bench_attn_paged", doc)
    print(f"total {time.time() - t0:.0f} s; wrote {path}")
    return 1 if bad or prefill_bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
