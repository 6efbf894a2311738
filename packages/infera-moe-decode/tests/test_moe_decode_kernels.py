"""The decode experts kernels against the fp32 reference; on the CPU under Triton's interpreter."""

import importlib
import os

import pytest
import torch

from infera_ops.moe_decode import reference
from infera_ops.moe_decode.reference import moe_experts_reference

pytestmark = pytest.mark.interpret
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 from interpreter start (nox sets it)",
                allow_module_level=True)
pytest.importorskip("triton")
launch = importlib.import_module("infera_ops.moe_decode.launch")
kernels = importlib.import_module("infera_ops.moe_decode.kernels")
# small blocks so the test shapes cross several blocks and leave ragged edges
SMALL = launch.LaunchConfig(block_i=16, block_h=32, block_n=32, block_k=16)
SMALL_FUSED = launch.LaunchConfig(form="fused", block_i=16, block_h=32, block_n=16)
SMALL_PERSISTENT = launch.LaunchConfig(form="persistent", block_i=16, block_h=32, block_n=32, block_k=16)
SMALL_SPLIT_SUM = launch.LaunchConfig(form="split_sum", block_i=16, block_h=32, block_n=16, block_k=16)
# each token's (slot, 16-wide chunk of I) tiles in 3 shares merged in the kernel (fewer, all non-empty, where it has
# fewer tiles); most cases have shares that end inside a slot
SMALL_SPLIT_SUM_I = launch.LaunchConfig(form="split_sum", block_i=16, block_h=32, block_n=16, block_k=16,
                                        split_i=3)
# 3 chunks of each kind (the interpreter's one program takes them in turn): units split across chunks unevenly
SMALL_STREAM = launch.LaunchConfig(form="stream", block_i=16, block_h=32, block_n=16, block_k=16, programs_per_sm=3)
FORMS = pytest.mark.parametrize("config", [SMALL, SMALL_FUSED, SMALL_PERSISTENT, SMALL_SPLIT_SUM, SMALL_SPLIT_SUM_I,
                                           SMALL_STREAM],
                                ids=["split", "fused", "persistent", "split_sum", "split_sum_i", "stream"])


def _routing(M, E, topk, gen):
    """Distinct experts per token (as vLLM's top-k gives), random weights; few experts -> tokens share."""
    ids = torch.stack([torch.randperm(E, generator=gen)[:topk] for _ in range(M)]).to(torch.int32)
    weights = torch.rand(M, topk, generator=gen)
    return ids.to(DEVICE), (weights / weights.sum(1, keepdim=True)).to(DEVICE)


def _case(M, H, I, E, topk, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, H, generator=gen).to(DEVICE, dtype)
    w13 = (torch.randn(E, 2 * I, H, generator=gen) / H**0.5).to(DEVICE, dtype)
    w2 = (torch.randn(E, H, I, generator=gen) / I**0.5).to(DEVICE, dtype)
    return x, w13, w2, *_routing(M, E, topk, gen)


def _check(out, ref, dtype):
    assert not torch.isnan(out).any(), "unwritten (poisoned) elements in the output"
    tol = 3e-2 if dtype == torch.bfloat16 else 6e-3  # the bf16/fp16 intermediate and output roundings
    torch.testing.assert_close(out.float(), ref, atol=tol * ref.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("M, H, I, E, topk", [
    (1, 64, 32, 4, 1), (1, 96, 40, 8, 8), (3, 100, 24, 6, 4), (5, 48, 56, 5, 2), (16, 64, 32, 4, 3),
    (7, 130, 20, 16, 8),
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@FORMS
def test_moe_experts(M, H, I, E, topk, dtype, config):
    x, w13, w2, ids, weights = _case(M, H, I, E, topk, dtype, seed=M * 1000 + H)
    out = torch.full((M, H), float("nan"), dtype=dtype, device=DEVICE)
    got = launch.moe_experts(x, w13, w2, weights, ids, out=out, config=config)
    assert got.data_ptr() == out.data_ptr()
    _check(got, moe_experts_reference(x, w13, w2, weights, ids), dtype)


@FORMS
def test_every_token_on_the_same_experts(config):
    """All tokens choose the same experts: one program per expert serves them all (one weight read)."""
    x, w13, w2, _, _ = _case(16, 64, 32, 8, 2, torch.bfloat16, seed=7)
    ids = torch.tensor([[3, 5]] * 16, dtype=torch.int32, device=DEVICE)
    weights = torch.rand(16, 2, device=DEVICE)
    _check(launch.moe_experts(x, w13, w2, weights, ids, config=config), moe_experts_reference(x, w13, w2, weights, ids),
           torch.bfloat16)


@pytest.mark.parametrize("form", launch.FORMS)
def test_default_blocks_int64_ids_and_strided_out(form):
    """Default blocks, int64 expert ids, bf16 router weights, an output that is a column slice of a wider
    buffer (row stride != H): the neighbouring columns must stay as they were."""
    x, w13, w2, ids, weights = _case(2, 256, 192, 4, 2, torch.bfloat16, seed=3)
    wide = torch.full((2, 300), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    out = wide[:, 20:276]
    launch.moe_experts(x, w13, w2, weights.to(torch.bfloat16), ids.long(), out=out,
                       config=launch.LaunchConfig(form=form))
    _check(out, moe_experts_reference(x, w13, w2, weights.to(torch.bfloat16).float(), ids), torch.bfloat16)
    assert torch.isnan(wide[:, :20]).all() and torch.isnan(wide[:, 276:]).all()


@FORMS
def test_expert_parallel_local_experts_only(config):
    """Under expert parallel vLLM's expert map sends global ids to this rank's experts (-1: held elsewhere).
    The output is the sum over the local experts only, a token with no local expert gets zeros; the
    positions of remote experts (several per token) must not leave unwritten partial rows (poisoned)."""
    M, H, I, E_global, topk = 5, 72, 40, 8, 4
    x, _, _, ids, weights = _case(M, H, I, E_global, topk, torch.bfloat16, seed=11)
    local = torch.tensor([1, 4, 6], device=DEVICE)  # this rank's experts, in its weight order
    gen = torch.Generator().manual_seed(12)
    w13 = (torch.randn(len(local), 2 * I, H, generator=gen) / H**0.5).to(DEVICE, torch.bfloat16)
    w2 = (torch.randn(len(local), H, I, generator=gen) / I**0.5).to(DEVICE, torch.bfloat16)
    expert_map = torch.full((E_global,), -1, dtype=torch.int32, device=DEVICE)
    expert_map[local] = torch.arange(len(local), dtype=torch.int32, device=DEVICE)
    ids[0] = torch.tensor([0, 2, 3, 5], dtype=ids.dtype)  # no local expert at all
    mapped = expert_map[ids.long()]
    ref = torch.zeros(M, H, device=DEVICE)
    for m in range(M):
        keep = mapped[m] >= 0
        if keep.any():
            ref[m] = moe_experts_reference(x[m:m + 1], w13, w2, weights[m:m + 1, keep], mapped[m:m + 1, keep])[0]
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    launch.moe_experts(x, w13, w2, weights, ids, out=out, config=config, expert_map=expert_map)
    assert (out[0] == 0).all()
    _check(out, ref, torch.bfloat16)


def test_block_i_shrinks_to_fill_the_gpu():
    cfg = launch.LaunchConfig(block_i=64, min_programs=300)
    assert launch.block_i_for(cfg, 8, 768) == 16  # 8 x 48 = 384 >= 300; 8 x 24 = 192 is not
    assert launch.block_i_for(cfg, 8, 2048) == 32  # 8 x 64 = 512; 8 x 32 = 256 is not
    assert launch.block_i_for(cfg, 2, 64) == 16  # never below 16
    assert launch.block_i_for(launch.LaunchConfig(block_i=64), 1, 64) == 64  # min_programs 0: as given


def test_min_programs_gives_the_same_answer():
    x, w13, w2, ids, weights = _case(1, 80, 96, 6, 2, torch.bfloat16, seed=5)
    cfg = launch.LaunchConfig(form="fused", block_i=64, block_h=32, block_n=32, min_programs=12)
    assert launch.block_i_for(cfg, 2, 96) == 16
    _check(launch.moe_experts(x, w13, w2, weights, ids, config=cfg), moe_experts_reference(x, w13, w2, weights, ids),
           torch.bfloat16)


def test_gate_up_columns_fill_the_gpu():
    """fill_per_sm cuts the gate/up kernel's columns per program (multiples of 16, at most the tile) so the
    experts in play give about that many programs per SM (8 off CUDA)."""
    cpu = torch.device("cpu")
    assert launch.gate_up_cols(launch.LaunchConfig(block_i=64), 64, 8, 768, cpu) == 64  # 0: the tile
    fill = launch.LaunchConfig(block_i=64, fill_per_sm=1)
    assert launch.gate_up_cols(fill, 64, 2, 100, cpu) == 32  # 2 x 100 / 8 = 25 -> 32: 2 x 4 = 8 programs
    assert launch.gate_up_cols(fill, 64, 1, 40, cpu) == 16  # never below 16
    assert launch.gate_up_cols(fill, 64, 8, 2048, cpu) == 64  # never above the tile
    assert launch.gate_up_cols(fill, 32, 2, 200, cpu) == 32  # the tile min_programs chose bounds it


@pytest.mark.parametrize("form", ["split", "split_sum"])
@pytest.mark.parametrize("M, I, E, topk", [(1, 100, 4, 2), (3, 56, 6, 4)])
def test_fill_per_sm_gives_the_same_answer(form, M, I, E, topk):
    """Columns per program below the tile and not dividing I (the last program's share is short): every
    activation column is written once, the answer is the reference's."""
    x, w13, w2, ids, weights = _case(M, 80, I, E, topk, torch.bfloat16, seed=I + M)
    cfg = launch.LaunchConfig(form=form, block_i=64, block_h=32, block_n=16, block_k=16, fill_per_sm=1)
    assert launch.gate_up_cols(cfg, 64, min(M * topk, E), I, torch.device(DEVICE)) < 64 or DEVICE == "cuda"
    out = torch.full((M, 80), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    launch.moe_experts(x, w13, w2, weights, ids, out=out, config=cfg)
    _check(out, moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)


def test_split_sum_merge_leaves_its_counters_zero():
    """The split_sum form's in-kernel merge counts each (token, column block)'s shares and the last one in
    sets the count back to zero, so the next call (or graph replay) starts from zero: two calls in a row on
    different inputs are each right, and the counters are zero after."""
    cfg = launch.LaunchConfig(form="split_sum", block_i=16, block_h=32, block_n=16, block_k=16, split_i=4)
    for seed in (1, 2):
        x, w13, w2, ids, weights = _case(3, 48, 72, 5, 2, torch.bfloat16, seed=seed)
        _check(launch.moe_experts(x, w13, w2, weights, ids, config=cfg),
               moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)
        assert not launch.sync_counters(x.device, 1).any()


def test_unknown_form_is_refused():
    with pytest.raises(ValueError, match="form"):
        launch.LaunchConfig(form="atomic")


def test_non_unit_stride_is_refused():
    x, w13, w2, ids, weights = _case(2, 64, 32, 4, 2, torch.bfloat16, seed=1)
    with pytest.raises(ValueError, match="unit stride"):
        launch.moe_experts(x.t().contiguous().t(), w13, w2, weights, ids)


@pytest.mark.parametrize("family", ["cpu", "sm90"])
def test_every_shipped_tuning_config_is_correct(family, monkeypatch):
    """The blocks each packaged tuning file ships, at each token bound it names, give the right answer
    (a file that parses but launches a broken configuration must not ship)."""
    policy = importlib.import_module("infera_ops.moe_decode.policy")
    monkeypatch.delenv("INFERA_MOE_DECODE_TUNING", raising=False)
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS", raising=False)
    tuned = policy.load(family)
    assert tuned is not None and tuned.largest_served >= 1
    launches = [(M, tuned.config_for(M)) for M in sorted({1, tuned.largest_served} | {b for b, _ in tuned.by_tokens})]
    launches += [(bound, cfg) for entries in tuned.by_shape.values() for bound, cfg in entries]
    for M, cfg in launches:
        x, w13, w2, ids, weights = _case(M, 136, 72, 6, 3, torch.bfloat16, seed=M)
        out = torch.full((M, 136), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        launch.moe_experts(x, w13, w2, weights, ids, out=out, config=cfg)
        _check(out, moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)


@pytest.mark.parametrize("cfg", [
    launch.LaunchConfig(form="persistent", block_i=16, block_h=32, block_n=32, block_k=16),
    launch.LaunchConfig(form="stream", block_i=16, block_h=32, block_n=16, block_k=16, prefetch_down=True)],
    ids=["persistent", "stream"])
def test_ticket_forms_leave_their_counters_zero_and_replay_in_a_cuda_graph(cfg):
    """The persistent and stream forms' counters (tickets, programs done, readiness) are zero after every
    launch, so the next launch, or the next replay of a CUDA graph that captured it, starts clean; on a GPU
    the same launches captured in one graph and replayed give the eager answers (every program taking
    tickets, down work waiting on the gate/up work it needs; the stream form's down chunks asking L2 for
    their weights first)."""
    cases = [_case(M, 136, 72, 12, 4, torch.bfloat16, seed=40 + M) for M in (1, 3, 8)]
    for x, w13, w2, ids, weights in cases:
        _check(launch.moe_experts(x, w13, w2, weights, ids, config=cfg),
               moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)
        assert not launch.sync_counters(x.device, 2 + ids.numel()).any()
    if DEVICE != "cuda":
        return
    outs = [torch.full((c[0].shape[0], 136), float("nan"), dtype=torch.bfloat16, device=DEVICE) for c in cases]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # the eager warm-up on the capture stream, as vLLM's
        for (x, w13, w2, ids, weights), out in zip(cases, outs):
            launch.moe_experts(x, w13, w2, weights, ids, out=out, config=cfg)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for (x, w13, w2, ids, weights), out in zip(cases, outs):
            launch.moe_experts(x, w13, w2, weights, ids, out=out, config=cfg)
    for _ in range(20):
        for out in outs:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for (x, w13, w2, ids, weights), out in zip(cases, outs):
            _check(out, moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)


@pytest.mark.skipif(DEVICE != "cuda", reason="real model sizes: GPU only")
@pytest.mark.parametrize("M", [1, 2, 16])
@pytest.mark.parametrize("form, per_sm, early, fill", [
    ("split", 1, False, 0), ("split", 1, True, 0), ("fused", 1, False, 0), ("persistent", 1, False, 0),
    ("persistent", 3, False, 0), ("persistent", 64, False, 0), ("split_sum", 1, False, 0), ("split", 1, False, 1),
    ("split_sum", 1, False, 1), ("split_sum", 4, False, 1), ("stream", 1, False, 0), ("stream", 64, True, 0)])
def test_qwen3_moe_dims_on_the_gpu(M, form, per_sm, early, fill):
    """Qwen3-30B-A3B's expert shape (E128 H2048 I768 top-8) at decode batch sizes, every form; the split one
    also with the down kernel started early (PDL, prefetching W2 before it waits); the persistent one also
    with far more programs than the GPU holds at once (64 per SM), which its tickets must survive; the split
    forms also with the gate/up columns cut to fill the SMs (48 of the 64-row tile at M = 1 on an H200), the
    split_sum one also with its down pass over 4 shares of I merged in the kernel; the stream one with one
    program per SM, and with 64 per SM (more than fit at once: its tickets must survive) and its L2
    prefetch of the down weights."""
    x, w13, w2, ids, weights = _case(M, 2048, 768, 128, 8, torch.bfloat16, seed=M)
    out = torch.full((M, 2048), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    cfg = launch.LaunchConfig(form=form, block_i=64 if fill else 32, programs_per_sm=per_sm,
                              early_down=early and form == "split", prefetch_down=early and form == "stream",
                              fill_per_sm=fill, split_i=per_sm if form == "split_sum" else 1)
    launch.moe_experts(x, w13, w2, weights, ids, out=out, config=cfg)
    _check(out, moe_experts_reference(x, w13, w2, weights, ids), torch.bfloat16)


FP8 = torch.float8_e4m3fn
FP8_MAX = torch.finfo(FP8).max


def _quantize(w, scheme, block=None):
    """``w`` [E, N, K] as FP8 with fp32 scales (amax / fp8 max per group, as vLLM's quantization), then the
    scales times a random factor in [0.5, 2) so that none is a power of two or 1."""
    E, N, K = w.shape
    if scheme == "block":
        bn, bk = block
        pad = torch.zeros(E, -(-N // bn) * bn, -(-K // bk) * bk)
        pad[:, :N, :K] = w
        groups = pad.reshape(E, pad.shape[1] // bn, bn, pad.shape[2] // bk, bk).abs().amax(dim=(2, 4))
        scale = groups.clamp(min=1e-6) / FP8_MAX
        full = scale.repeat_interleave(bn, 1)[:, :N].repeat_interleave(bk, 2)[:, :, :K]
    else:
        rows = {"tensor": 1, "half": 2, "channel": N}[scheme]
        scale = w.reshape(E, rows, -1).abs().amax(dim=2) / FP8_MAX
        full = scale.repeat_interleave(N // rows, 1)[:, :, None]
        scale = scale.reshape(E) if scheme == "tensor" else scale
    q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, scale.float()


def _fp8_case(M, H, I, E, topk, scheme, block, seed):
    x, w13, w2, ids, weights = _case(M, H, I, E, topk, torch.float32, seed)
    q13, s13 = _quantize(w13.cpu(), scheme, block)
    q2, s2 = _quantize(w2.cpu(), "tensor" if scheme == "half" else scheme, block)
    gen = torch.Generator().manual_seed(seed + 1)
    s13 = s13 * (0.5 + 1.5 * torch.rand(s13.shape, generator=gen))
    s2 = s2 * (0.5 + 1.5 * torch.rand(s2.shape, generator=gen))
    scales = launch.ExpertScales(s13.to(DEVICE), s2.to(DEVICE), block)
    return x.to(torch.bfloat16), q13.to(DEVICE), q2.to(DEVICE), ids, weights, scales


FP8_FORMS = pytest.mark.parametrize("config", [SMALL, SMALL_SPLIT_SUM, SMALL_SPLIT_SUM_I],
                                    ids=["split", "split_sum", "split_sum_i"])


@pytest.mark.parametrize("M, H, I, E, topk, scheme, block", [
    (1, 96, 40, 8, 8, "block", (32, 32)), (5, 100, 56, 5, 2, "block", (16, 64)), (3, 64, 48, 7, 3, "tensor", None),
    (2, 72, 24, 3, 2, "half", None), (16, 48, 40, 5, 4, "channel", None)])
@FP8_FORMS
def test_fp8_experts(M, H, I, E, topk, scheme, block, config):
    """FP8 weights (128 x 128-style blocks at test sizes with ragged edges, per tensor, gate and up halves
    apart, per channel) with scales != 1 against the fp32 reference over the dequantized weights; a kernel
    that dropped either projection's scales, or read one group's scale for another, fails."""
    x, q13, q2, ids, weights, scales = _fp8_case(M, H, I, E, topk, scheme, block, seed=M * 100 + H)
    out = torch.full((M, H), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    launch.moe_experts(x, q13, q2, weights, ids, out=out, config=config, scales=scales)
    ref = moe_experts_reference(x, reference.dequantize_experts(q13, scales.w13, block),
                                reference.dequantize_experts(q2, scales.w2, block), weights, ids)
    _check(out, ref, torch.bfloat16)


def test_fp8_refusals():
    """What the FP8 launch cannot read is refused, not computed wrong: a form without scaled weights, scales of
    another layout or dtype, FP8 weights without scales, scale groups no reduction chunk fits in."""
    x, q13, q2, ids, weights, scales = _fp8_case(2, 64, 32, 4, 2, "block", (32, 32), seed=9)
    with pytest.raises(ValueError, match="form"):
        launch.moe_experts(x, q13, q2, weights, ids, config=SMALL_FUSED, scales=scales)
    with pytest.raises(ValueError, match="block scales"):
        launch.moe_experts(x, q13, q2, weights, ids, config=SMALL, scales=scales._replace(block=(16, 32)))
    with pytest.raises(ValueError, match="fp32"):
        launch.moe_experts(x, q13, q2, weights, ids, config=SMALL, scales=scales._replace(w2=scales.w2.half()))
    with pytest.raises(ValueError, match="scales"):
        launch.moe_experts(x, q13, q2, weights, ids, config=SMALL)
    with pytest.raises(ValueError, match="multiple of 16"):
        launch.chunk_within(128, 24, 1)
    assert launch.chunk_within(128, 96, 1) == 32 and launch.chunk_within(64, 128, 1) == 64
    assert launch.chunk_within(64, 1, 0) == 64  # one group along the reduction: any chunk
