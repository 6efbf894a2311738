"""What the paged-attention benchmark and tuner share (bench_attn_paged.py, bench_attn_paged_prefill.py,
tune_attn_paged.py): the cases (the KV cache as vLLM 0.26 lays it out, block tables, queries, sinks, ragged prefill
batches), the references they are checked against, each implementation called as vLLM calls it (ours, FA3,
vLLM's Triton), and the measurement of one (an eager checked call, CUDA-graph replays cycling over KV copies,
the replays' output checked again). The maths and the baselines' calls are described in bench_attn_paged.py
(decode) and bench_attn_paged_prefill.py (prefill)."""

from __future__ import annotations

import itertools
import math
import os
import sys
import traceback
from dataclasses import asdict, dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from _results import L2_BYTES, graph_us  # noqa: E402

HEADS = {  # name: (Hq, Hkv, D)
    "llama3-8b": (32, 8, 128),
    "smollm2": (9, 3, 64),
    "gpt-oss-20b": (64, 8, 64),
}
SINKS_CONFIG = "gpt-oss-20b"  # also timed with attention sinks ("gpt-oss-20b+sinks")
SWEEP_CONFIGS = ("llama3-8b", "smollm2")
# (B, ctx); batch 1 at 16k is the end-to-end preset's batch-1 row (`validate --preset attn-paged-h200`), where a
# decode step's attention is a long single-sequence read
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

MAX_KV_COPIES = 64
REP_MS = 20
# the launch sweep's grid (bench_attn_paged.py --sweep, tune_attn_paged.py)
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
                res["us"] = graph_us([lambda i=i: impl.run(i) for i in range(copies)], rep)
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


def ok_flag(row: dict, name: str) -> str:
    ok = row[f"{name}_ok"]
    if ok is None:
        return "n/a"
    if ok:
        return "ok"
    return "ERR" if row[f"{name}_error"] else "BAD"


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
