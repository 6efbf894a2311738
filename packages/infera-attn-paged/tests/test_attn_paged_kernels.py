"""The split-KV decode kernel against the fp32 torch reference (reference.py), under Triton's interpreter on
the CPU and for real on GPUs: random paged caches laid out as vLLM 0.26/0.32 hand them over (K and V packed
along the last dim, NHD physical order), random block tables, ragged lengths, poisoned outputs."""

import os

import pytest
import torch
import triton

from infera_ops.attn_paged import launch
from infera_ops.attn_paged.reference import paged_decode_reference

pytestmark = pytest.mark.interpret
DEV = "cuda" if torch.cuda.is_available() else "cpu"
if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton kernels on the CPU need TRITON_INTERPRET=1 (nox sets it)", allow_module_level=True)
TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}  # atol and rtol: probabilities and outputs round to the dtype


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def paged_case(B, Hq, Hkv, D, page, lens, dtype=torch.bfloat16, spare_blocks=5):
    """q, key/value cache views, block table and lengths for one decode batch (pages scattered at random)."""
    pages = max(1, -(-max(lens) // page))
    nblocks = B * pages + spare_blocks
    kv = torch.randn(nblocks, page, Hkv, 2 * D, dtype=dtype, device=DEV).permute(0, 2, 1, 3)  # logical (B, H, N, 2D)
    k, v = kv.transpose(1, 2).split(D, dim=-1)
    bt = torch.randperm(nblocks, device=DEV)[: B * pages].view(B, pages).to(torch.int32)
    q = torch.randn(B, Hq, D, dtype=dtype, device=DEV)
    return q, k, v, bt, torch.tensor(lens, dtype=torch.int32, device=DEV)


# a slice per key at least: every sequence takes the whole cap S of slices (at these short lengths the
# default policy would give each one or two), so the merge of many slices, empty ones included, is exercised
EVERY_SLICE = launch.SplitPolicy(split_keys=1)


def check(q, k, v, bt, lens, *, sinks=None, window_left=-1, softcap=0.0, num_splits=None, workspace=None,
          policy=None):
    out = torch.full_like(q, float("nan"))  # poisoned: an element the kernel does not write fails
    scale = q.shape[-1] ** -0.5
    policy = policy or (EVERY_SLICE if num_splits else None)
    launch.paged_decode(q, k, v, bt, lens, scale, out, sinks=sinks, window_left=window_left, softcap=softcap,
                        num_splits=num_splits, workspace=workspace, policy=policy)
    ref = paged_decode_reference(q, k, v, bt, lens, scale, sinks=sinks, window_left=window_left, softcap=softcap)
    assert not out.isnan().any(), "unwritten output elements"
    torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])
    return out


@pytest.mark.parametrize("Hq,Hkv,D", [(8, 2, 64), (9, 3, 64), (4, 4, 80), (6, 1, 96), (8, 8, 128), (4, 2, 256)])
@pytest.mark.parametrize("splits", [1, 3, 8])
def test_head_shapes_and_splits(Hq, Hkv, D, splits):
    lens = [37, 1, 130, 64]  # one key, tile boundaries, a length past several tiles
    check(*paged_case(4, Hq, Hkv, D, 16, lens), num_splits=splits)


@pytest.mark.parametrize("page", [16, 32, 64])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_block_sizes_and_dtypes(page, dtype):
    check(*paged_case(3, 8, 2, 64, page, [200, 17, 96], dtype=dtype))  # default split choice


def test_more_splits_than_keys_and_empty_sequences():
    # padded sequences (length 0, as vLLM pads a CUDA-graph batch) come out as zeros; splits with no keys
    q, k, v, bt, lens = paged_case(4, 8, 2, 64, 16, [3, 0, 40, 0])
    for splits in (1, 16):
        out = check(q, k, v, bt, lens, num_splits=splits)
        assert (out[1] == 0).all() and (out[3] == 0).all()


@pytest.mark.parametrize("splits", [65, 130])
def test_more_slices_than_the_reduce_merges_at_once(splits):
    """Past launch.REDUCE_BLOCK_S slices the reduce merges them in steps with a running maximum: the long
    sequence has keys in every slice (a slice is at least one 64-key tile), so each step rescales the sums of
    the steps before it; slices past a short sequence's keys (empty: lse -inf) fill whole steps. With and
    without sinks."""
    assert splits > launch.REDUCE_BLOCK_S
    q, k, v, bt, lens = paged_case(3, 4, 2, 64, 16, [64 * splits - 5, 70, 2])
    q = q * 4  # peaked logits: the slices' log-sum-exps differ by units, so a step that skipped the
    # rescale of the earlier steps' sums would weigh them wrongly by far more than the tolerance
    check(q, k, v, bt, lens, num_splits=splits)
    check(q, k, v, bt, lens, sinks=torch.randn(4, device=DEV) * 2, num_splits=splits)


@pytest.mark.parametrize("splits", [1, 4])
def test_sinks(splits):
    q, k, v, bt, lens = paged_case(3, 8, 2, 64, 16, [90, 5, 33])
    sinks = torch.randn(8, device=DEV) * 2
    out = check(q, k, v, bt, lens, sinks=sinks, num_splits=splits)
    plain = paged_decode_reference(q, k, v, bt, lens, 64 ** -0.5)
    assert (out.float() - plain).abs().max() > 1e-2  # the sink changed the answer: the test can fail


@pytest.mark.parametrize("splits", [1, 5])
@pytest.mark.parametrize("window", [0, 7, 50, 1000])
def test_sliding_window(window, splits):
    check(*paged_case(3, 4, 2, 64, 16, [120, 9, 64]), window_left=window, num_splits=splits)


@pytest.mark.parametrize("splits", [1, 4])
def test_softcap(splits):
    q, k, v, bt, lens = paged_case(2, 4, 1, 128, 16, [75, 140])
    check(q * 8, k, v, bt, lens, softcap=5.0, num_splits=splits)  # large logits so the cap bites


def test_all_features_together_and_strided_query():
    q, k, v, bt, lens = paged_case(3, 9, 3, 80, 32, [100, 61, 2])
    wide = torch.randn(3, 12, 80, dtype=q.dtype, device=DEV)  # q as a head slice of a wider tensor
    wide[:, 1:10] = q
    check(wide[:, 1:10], k, v, bt, lens, sinks=torch.randn(9, device=DEV), window_left=40, softcap=20.0,
          num_splits=4)


def test_workspace_is_used_and_checked():
    q, k, v, bt, lens = paged_case(2, 8, 2, 64, 16, [50, 70])
    ws = launch.Workspace(2 * 4, 8, 64, DEV, max_splits=4)  # 2 sequences x 4 slices
    check(q, k, v, bt, lens, num_splits=4, workspace=ws)
    with pytest.raises(ValueError, match="workspace too small"):
        launch.paged_decode(q, k, v, bt, lens, 0.1, torch.empty_like(q), num_splits=8, workspace=ws)


MERGED = launch.SplitPolicy(split_keys=1, merge_max_slices=launch.MAX_SPLITS)


@pytest.mark.parametrize("Hq,Hkv,D,splits", [(9, 3, 64, 3), (8, 8, 128, 8), (4, 2, 256, 3), (9, 3, 64, 65)])
def test_slices_merged_in_the_kernel(Hq, Hkv, D, splits):
    """The last slice of each (sequence, KV head) merges them in the main kernel (no reduce launch), all G
    heads at once: against the fp32 reference with every feature on (65 slices: more than one merge step),
    the same output as the reduce kernel's merge (the same sums in the same order where both take the same
    slices per step: bit for bit under the interpreter; else the same sums in other steps, within fp32
    rounding), and the counters back at zero after each of two calls (a CUDA graph replays the launch on the
    same counters)."""
    q, k, v, bt, lens = paged_case(4, Hq, Hkv, D, 16, [64 * splits - 3, 1, 130, 0])
    sinks = torch.randn(Hq, device=DEV) * 2
    ws = launch.Workspace(4 * splits, Hq, D, DEV, max_splits=splits)
    kw = dict(sinks=sinks, window_left=64 * splits - 40, softcap=30.0, num_splits=splits, workspace=ws)
    for _ in range(2):
        merged = check(q, k, v, bt, lens, policy=MERGED, **kw)
        assert (ws.count == 0).all(), "counters left non-zero"
    reduced = check(q, k, v, bt, lens, policy=EVERY_SLICE, **kw)
    same_steps = launch.merge_step(triton.next_power_of_2(Hq // Hkv), triton.next_power_of_2(D), splits) == min(
        launch.REDUCE_BLOCK_S, triton.next_power_of_2(splits))
    if DEV == "cpu" and same_steps:
        assert torch.equal(merged, reduced)
    else:
        torch.testing.assert_close(merged, reduced, atol=1e-3, rtol=1e-3)


def test_a_merged_launch_has_no_reduce_kernel(monkeypatch):
    launched = []
    real = launch._paged_decode_reduce_kernel
    monkeypatch.setattr(launch, "_paged_decode_reduce_kernel", type("Spy", (), {
        "__getitem__": lambda self, grid: (launched.append(grid), real[grid])[1]})())
    q, k, v, bt, lens = paged_case(2, 8, 2, 64, 16, [70, 90])
    check(q, k, v, bt, lens, num_splits=4, policy=MERGED)
    assert launched == []
    check(q, k, v, bt, lens, num_splits=4, policy=EVERY_SLICE)
    assert launched == [(2, 8)]
    # merged up to a slice cap: at a cap of 4 in the kernel, at 8 by the reduce kernel
    up_to_4 = launch.SplitPolicy(split_keys=1, merge_max_slices=4)
    launched.clear()
    check(q, k, v, bt, lens, num_splits=4, policy=up_to_4)
    assert launched == []
    check(q, k, v, bt, lens, num_splits=8, policy=up_to_4)
    assert launched == [(2, 8)]


@pytest.mark.parametrize("by_group", [(), ((2, launch.LaunchConfig(block_n=64, num_warps=1)),), ((2, None),),
                                      ((3, launch.LaunchConfig(block_n=64, num_warps=1)),)])
def test_a_slice_cap_of_one_takes_the_unsplit_launch(monkeypatch, by_group):
    """LaunchConfig.unsplit serves launches whose slice cap is 1, the config itself the others; an
    ``unsplit_by_group`` entry for the call's query group (2 query heads per KV head here) replaces
    ``unsplit`` (None: the config itself), one for another group does not."""
    launched = []
    kernel = launch._paged_decode_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append((grid[2], kwargs["BLOCK_N"], kwargs["num_warps"]))
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(launch, "_paged_decode_kernel", Spy())
    cfg = launch.LaunchConfig(block_n=32, num_warps=4, unsplit=launch.LaunchConfig(block_n=16, num_warps=2),
                              unsplit_by_group=by_group)
    q, k, v, bt, lens = paged_case(2, 4, 2, 64, 16, [40, 70])
    for splits in (1, 2):
        out = torch.full_like(q, float("nan"))
        launch.paged_decode(q, k, v, bt, lens, 0.125, out, num_splits=splits, config=cfg, policy=EVERY_SLICE)
        ref = paged_decode_reference(q, k, v, bt, lens, 0.125)
        torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])
    unsplit = {(): (16, 2), ((2, launch.LaunchConfig(block_n=64, num_warps=1)),): (64, 1),
               ((2, None),): (32, 4), ((3, launch.LaunchConfig(block_n=64, num_warps=1)),): (16, 2)}[by_group]
    assert launched == [(1, *unsplit), (2, 32, 4)]


def test_rows_past_the_batch_are_untouched():
    q, k, v, bt, lens = paged_case(2, 4, 2, 64, 16, [30, 44])
    out = torch.full((3, 4, 64), 7.0, dtype=q.dtype, device=DEV)
    launch.paged_decode(q, k, v, bt, lens, 0.125, out[:2], num_splits=2)
    assert (out[2] == 7.0).all()


def test_bad_shapes_raise():
    q, k, v, bt, lens = paged_case(2, 6, 4, 64, 16, [5, 6])  # 6 query heads over 4 KV heads
    with pytest.raises(ValueError, match="does not match"):
        launch.paged_decode(q, k, v, bt, lens, 0.1)


def test_split_cap_fills_the_gpu_and_ignores_lengths():
    """The slice cap depends on the batch size and heads only (a CUDA graph per batch size); it shrinks as
    the batch grows, to one slice once the batch alone fills the GPU."""
    dev = torch.device(DEV)
    pol = launch.SPLIT_POLICY
    caps = [launch.split_cap(b, 8, dev) for b in (1, 16, 256, 4096)]
    assert caps == sorted(caps, reverse=True)
    assert caps[0] == min(pol.max_splits, pol.programs_per_sm * launch._sm_count(dev) // 8)
    assert caps[-1] == 1
    for b in (1, 3, 64):
        s = launch.split_cap(b, 3, dev)
        assert 1 <= s <= pol.max_splits and (s == 1 or b * 3 * s <= pol.programs_per_sm * launch._sm_count(dev))
    # a policy's own ceiling, within launch.MAX_SPLITS
    many = launch.SplitPolicy(programs_per_sm=1024, max_splits=128)
    assert launch.split_cap(1, 1, dev, many) == 128
    assert launch.split_cap(1, 1, dev, launch.SplitPolicy(programs_per_sm=1024, max_splits=4096)) == launch.MAX_SPLITS


@pytest.mark.parametrize("window", [-1, 40])
def test_slice_count_follows_each_sequence_length(window):
    """Under one cap, each sequence takes ceil(keys / split_keys) slices on the device, at most the cap: the
    workspace rows a sequence writes show how many it took (poisoned rows past them stay untouched, and a
    one-slice sequence writes its output directly, no partial rows at all)."""
    policy = launch.SplitPolicy(split_keys=32)
    cap = 8
    lens = [1, 31, 33, 100, 300, 0]
    q, k, v, bt, seq_lens = paged_case(len(lens), 8, 2, 64, 16, lens)
    ws = launch.Workspace(len(lens) * cap, 8, 64, DEV, max_splits=cap)
    ws.lse.fill_(float("nan"))
    ws.out.fill_(float("nan"))  # rows past a sequence's slices hold NaN: none may leak into the merge
    check(q, k, v, bt, seq_lens, window_left=window, num_splits=cap, workspace=ws, policy=policy)
    want = [min(cap, max(1, -(-(n if window < 0 else min(n, window + 1)) // 32))) for n in lens]
    assert launch.slices_per_sequence(seq_lens, cap, window_left=window, policy=policy).tolist() == want
    written = ~ws.lse[: len(lens) * 8 * cap].view(len(lens), 8, cap).isnan()  # [B, Hq, S]
    for b, n in enumerate(want):
        expect = torch.zeros(cap, dtype=torch.bool, device=DEV)
        if n > 1:
            expect[:n] = True
        assert (written[b] == expect).all(), (b, lens[b], n, written[b])


def ragged_case(Hq, Hkv, D, page, query_lens, contexts, dtype=torch.bfloat16):
    """A prefill / chunked-prefill / mixed batch: request r has contexts[r] cached keys and query_lens[r] new
    tokens (already written to the cache, as vLLM does before attention)."""
    lens = [c + n for c, n in zip(contexts, query_lens)]
    q, k, v, bt, seq_lens = paged_case(len(lens), Hq, Hkv, D, page, lens, dtype=dtype)
    T = sum(query_lens)
    q = torch.randn(T, Hq, D, dtype=dtype, device=DEV)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    return q, k, v, bt, seq_lens, qsl


def check_prefill(q, k, v, bt, seq_lens, qsl, **kw):
    from infera_ops.attn_paged.reference import paged_prefill_reference

    out = torch.full_like(q, float("nan"))
    scale = q.shape[-1] ** -0.5
    block_m = kw.pop("block_m", None)
    launch.paged_prefill(q, k, v, bt, seq_lens, qsl, scale, out, block_m=block_m, **kw)
    ref = paged_prefill_reference(q, k, v, bt, seq_lens, qsl, scale, **kw)
    assert not out.isnan().any(), "unwritten output elements"
    torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])


@pytest.mark.parametrize("Hq,Hkv,D", [(8, 2, 64), (9, 3, 64), (4, 4, 80), (6, 1, 96), (4, 2, 128), (2, 1, 256)])
def test_prefill_ragged_heads(Hq, Hkv, D):
    # plain prefill, chunked prefill with context, a decode token in the mix, a one-token prompt
    check_prefill(*ragged_case(Hq, Hkv, D, 16, query_lens=[37, 20, 1, 1], contexts=[0, 45, 70, 0]))


@pytest.mark.parametrize("block_m", [16, 32])
def test_prefill_block_rows_and_pages(block_m):
    check_prefill(*ragged_case(8, 2, 64, 32, query_lens=[50, 3, 17], contexts=[10, 0, 90]), block_m=block_m)


def test_prefill_features():
    case = ragged_case(9, 3, 80, 16, query_lens=[30, 12, 1], contexts=[0, 40, 25])
    check_prefill(*case, sinks=torch.randn(9, device=DEV))
    check_prefill(*case, window_left=9)
    check_prefill(*case, softcap=10.0)
    check_prefill(*case, sinks=torch.randn(9, device=DEV), window_left=0, softcap=10.0)


def test_prefill_fp16_and_strided_query():
    q, k, v, bt, seq_lens, qsl = ragged_case(4, 2, 64, 16, query_lens=[19, 6], contexts=[5, 33], dtype=torch.float16)
    wide = torch.randn(q.shape[0], 6, 64, dtype=q.dtype, device=DEV)
    wide[:, 2:6] = q
    check_prefill(wide[:, 2:6], k, v, bt, seq_lens, qsl)


# Quantized KV caches (kernels.py, Quantized KV caches): the caches written as vLLM's TRITON_ATTN writes them
# (reference.quantize_*), read with bf16 queries, against the fp32 reference over the dequantized cache
FP8 = torch.float8_e4m3fn
KV_QUANTS = ["fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"]


def quantized(k, v, kind):
    """(k_q, v_q, KVScales) of bf16 caches in one of vLLM's quantized KV-cache dtypes: per-tensor scales
    away from 1, per-(token, head) scale caches as strided views of one buffer (as TRITON_ATTN's are)."""
    from infera_ops.attn_paged.reference import quantize_per_tensor, quantize_per_token_head

    if kind.endswith("per_token_head"):
        dtype = torch.int8 if kind.startswith("int8") else FP8
        (kq, ks), (vq, vs) = quantize_per_token_head(k, dtype), quantize_per_token_head(v, dtype)
        both = torch.stack([ks, vs], dim=-1)  # [num_blocks, page, Hkv, 2]: the two scale caches share strides
        return kq, vq, launch.KVScales(launch.KV_PER_TOKEN_HEAD, both[..., 0], both[..., 1])
    dtype = torch.float8_e5m2 if kind == "fp8_e5m2" else FP8
    k_scale, v_scale = (torch.tensor(s, device=DEV) for s in (0.037, 0.021))
    return (quantize_per_tensor(k, k_scale, dtype), quantize_per_tensor(v, v_scale, dtype),
            launch.KVScales(launch.KV_PER_TENSOR, k_scale, v_scale))


@pytest.mark.parametrize("kind", KV_QUANTS)
@pytest.mark.parametrize("Hq,Hkv,D,splits", [(9, 3, 64, 1), (4, 2, 80, 4), (8, 2, 128, 3)])
def test_quantized_caches_decode(kind, Hq, Hkv, D, splits):
    """Decode over quantized caches with bf16 queries, one slice and several (merged by the reduce kernel),
    against the reference over the same dequantized elements; and the answer moves with the scales (a kernel
    that ignored them would fail)."""
    q, k, v, bt, lens = paged_case(3, Hq, Hkv, D, 16, [70, 1, 33])
    kq, vq, scales = quantized(k * 3, v * 2, kind)
    out = torch.full_like(q, float("nan"))
    launch.paged_decode(q, kq, vq, bt, lens, D ** -0.5, out, num_splits=splits, kv_scales=scales,
                        policy=EVERY_SLICE if splits > 1 else None)
    ref = paged_decode_reference(q, kq, vq, bt, lens, D ** -0.5, kv_scales=scales)
    assert not out.isnan().any(), "unwritten output elements"
    torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])
    unscaled = paged_decode_reference(q, kq, vq, bt, lens, D ** -0.5)
    assert (ref - unscaled).abs().max() > 0.1


def test_quantized_caches_with_every_feature_and_merged_slices():
    q, k, v, bt, lens = paged_case(3, 8, 2, 64, 16, [130, 5, 64])
    for kind in ("fp8", "int8_per_token_head"):
        kq, vq, scales = quantized(k, v, kind)
        kw = dict(sinks=torch.randn(8, device=DEV), window_left=50, softcap=20.0)
        out = torch.full_like(q, float("nan"))
        launch.paged_decode(q * 4, kq, vq, bt, lens, 0.125, out, num_splits=4, kv_scales=scales, policy=MERGED, **kw)
        ref = paged_decode_reference(q * 4, kq, vq, bt, lens, 0.125, kv_scales=scales, **kw)
        torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])


@pytest.mark.parametrize("kind", KV_QUANTS)
def test_quantized_caches_prefill(kind):
    """Prefill, chunked prefill with context and a decode token in one ragged batch over quantized caches."""
    from infera_ops.attn_paged.reference import paged_prefill_reference

    q, k, v, bt, seq_lens, qsl = ragged_case(6, 2, 64, 16, query_lens=[21, 9, 1], contexts=[0, 40, 17])
    kq, vq, scales = quantized(k * 2, v * 3, kind)
    out = torch.full_like(q, float("nan"))
    launch.paged_prefill(q, kq, vq, bt, seq_lens, qsl, 0.125, out, block_m=16, kv_scales=scales,
                         window_left=30 if kind == "fp8" else -1)
    ref = paged_prefill_reference(q, kq, vq, bt, seq_lens, qsl, 0.125, kv_scales=scales,
                                  window_left=30 if kind == "fp8" else -1)
    assert not out.isnan().any(), "unwritten output elements"
    torch.testing.assert_close(out.float(), ref, atol=TOL[q.dtype], rtol=TOL[q.dtype])


def test_kv_alignment_of_inline_scale_rows():
    """TRITON_ATTN's per-(token, head) pages keep each row's fp32 scale after its D bytes: the rows the kernels
    read are 4-byte aligned (kernels.py, Row alignment); plain bf16 pages 16-byte aligned."""
    D, Hkv, page = 64, 2, 16
    kv = torch.zeros(5, Hkv, page, 2 * (D + 4), dtype=torch.int8, device=DEV).permute(0, 2, 1, 3)
    k, v = (half[..., :D] for half in kv.split(D + 4, dim=-1))
    assert launch.kv_alignment(k, v) == 4
    plain = torch.zeros(5, page, Hkv, 2 * D, dtype=torch.bfloat16, device=DEV)
    assert launch.kv_alignment(*plain.split(D, dim=-1)) == 16
    assert launch.kv_alignment(plain[..., 1:D + 1], plain[..., D:]) == 2


def test_quantized_caches_need_their_scales():
    q, k, v, bt, lens = paged_case(2, 4, 2, 64, 16, [5, 6])
    kq, vq, scales = quantized(k, v, "int8_per_token_head")
    with pytest.raises(ValueError, match="needs its KVScales"):
        launch.paged_decode(q, kq, vq, bt, lens, 0.1)
    with pytest.raises(ValueError, match="per-tensor scales take fp8"):
        launch.paged_decode(q, kq, vq, bt, lens, 0.1, kv_scales=launch.KVScales(launch.KV_PER_TENSOR, *(
            torch.ones((), device=DEV),) * 2))
    with pytest.raises(ValueError, match="per-token-head scales"):
        launch.paged_decode(q, kq, vq, bt, lens, 0.1, kv_scales=launch.KVScales(
            launch.KV_PER_TOKEN_HEAD, scales.k[:1], scales.v[:1]))
