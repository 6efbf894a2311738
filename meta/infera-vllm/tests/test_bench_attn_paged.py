"""``benchmarks/bench_attn_paged.py`` and ``bench_attn_paged_prefill.py`` (their cases: ``_attn_paged_cases.py``)
on the CPU, under Triton's interpreter, with no timing: the cache builders lay the cache out as vLLM's backends
see it, the references agree with an independent one, a wrong kernel fails the benchmark's check, and our
kernel, vLLM's Triton (fp32, where vLLM's Triton is live; else our keyword arguments bound to
``unified_attention``'s signature) and FA3's arguments are called as the benchmarks call them on the GPU. Tiny
sizes of every head configuration of their tables."""

import dataclasses
import inspect
import os
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.interpret
ROOT = Path(__file__).resolve().parents[3]
if not (ROOT / "benchmarks" / "_attn_paged_cases.py").is_file():
    pytest.skip("benchmarks/ is not here (tests run outside the repository)", allow_module_level=True)
if os.environ.get("TRITON_INTERPRET") != "1":  # on a GPU the benchmark itself runs these calls, at real sizes
    pytest.skip("the benchmarks' calls on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1 from interpreter "
                "start; nox sets it)", allow_module_level=True)
pytest.importorskip("infera_ops.attn_paged")
sys.path.insert(0, str(ROOT / "benchmarks"))
import _attn_paged_cases as cases  # noqa: E402
import bench_attn_paged as bench  # noqa: E402

from infera_ops.attn_paged import launch, reference  # noqa: E402

CPU = torch.device("cpu")
DECODE_ROWS = ((1, 256), (3, 200))  # 200: a partial last page and BLOCK_N tile; B=3: several sequences
# one tiny ragged batch of each kind: (kind, label, ((context, new tokens) per request))
PREFILL_CASES = (
    ("prefill", "37+20", ((0, 37), (0, 20))),
    ("chunked", "21@50+13@45", ((50, 21), (45, 13))),
    ("mixed", "30+3x1@40", ((40, 1), (33, 1), (40, 1), (0, 30))),
)


def _vllm_triton() -> str | None:
    """``live`` where vLLM's Triton kernels run here, ``placeholder`` under vLLM's CPU build, else None."""
    try:
        from vllm.triton_utils import HAS_TRITON
        from vllm.v1.attention.ops.triton_unified_attention import unified_attention  # noqa: F401
    except Exception:  # noqa: BLE001
        return None
    return "live" if HAS_TRITON else "placeholder"


def _gather_reference(case, sinks=None) -> torch.Tensor:
    """An independent reference: each sequence's keys and values copied out of the packed physical tensor
    position by position through the block table, then plain softmax attention (fp64)."""
    B, Hq, D, Hkv = case.B, case.Hq, case.D, case.Hkv
    G = Hq // Hkv
    phys = case.kvs[0].permute(0, 2, 1, 3)  # back to the allocated [num_blocks, bs, Hkv, 2D]
    bs = phys.shape[1]
    out = torch.zeros(B, Hq, D, dtype=torch.float64)
    for b in range(B):
        L = int(case.seq_lens[b])
        kv = torch.stack([phys[int(case.block_table[b, n // bs]), n % bs] for n in range(L)]).double()
        k, v = kv[..., :D], kv[..., D:]
        for h in range(Hq):
            s = (k[:, h // G] @ case.q[b, h].double()) * case.scale
            if sinks is not None:
                s = torch.cat([s, sinks[h].double().view(1)])
            out[b, h] = s.softmax(0)[:L] @ v[:, h // G]
    return out.float()


def _signature_binds(kwargs: dict) -> None:
    from vllm.v1.attention.ops.triton_unified_attention import unified_attention

    inspect.signature(unified_attention).bind(**kwargs)


@pytest.mark.parametrize("B, ctx", DECODE_ROWS)
@pytest.mark.parametrize("name", list(cases.HEADS))
def test_decode_case(name, B, ctx):
    Hq, Hkv, D = cases.HEADS[name]
    torch.manual_seed(0)
    case = cases.make_case(name, Hq, Hkv, D, B, ctx, device=CPU, copies=2)
    cases.check_layout(case)  # vLLM's packed NHD cache and its key / value views
    assert all(torch.equal(case.kvs[0], kv) for kv in case.kvs[1:]), "KV copies differ"
    bt = case.block_table.flatten().sort().values
    assert torch.equal(bt, torch.arange(bt.numel(), dtype=torch.int32)), "the block table is not a permutation"
    ref = cases.reference_out(reference, case)
    assert cases.max_err(ref, _gather_reference(case)) < 1e-4
    variants = [(None, ref)]
    if name == cases.SINKS_CONFIG:
        sinks = cases.make_sinks(Hq, ctx, CPU)
        ref_s = cases.reference_out(reference, case, sinks)
        assert cases.max_err(ref_s, _gather_reference(case, sinks)) < 1e-4
        assert cases.max_err(ref_s, ref) > 10 * cases.TOL, "sinks must change the output by far more than the tolerance"
        variants.append((sinks, ref_s))
    for sinks, r in variants:
        impl = cases.make_ours(launch, case, sinks)
        for i in range(len(case.kvs)):  # every KV copy, as the graph's calls cycle over them
            impl.out.fill_(float("nan"))
            impl.run(i)
            err = cases.max_err(impl.out, r)
            assert cases.is_ok(err), f"ours (sinks {sinks is not None}) copy {i}: err {err:.2e} ({impl.info})"
        res = cases.measure(lambda: cases.make_ours(launch, case, sinks), case, r, copies=2, rep=0, timed=False)
        assert res["ok"] is True and res["error"] is None, res
    # the check catches a kernel reading other keys, or half of them
    other_k, other_v = cases.split_kv(cases.build_kv_cache(case.keys[0].shape[0], Hkv, D, device=CPU), D)
    wrong = reference.paged_decode_reference(case.q, other_k, other_v, case.block_table, case.seq_lens, case.scale)
    assert not cases.is_ok(cases.max_err(wrong, ref))
    half = reference.paged_decode_reference(case.q, case.keys[0], case.values[0], case.block_table,
                                            case.seq_lens // 2, case.scale)
    assert not cases.is_ok(cases.max_err(half, ref))
    # vLLM's Triton as the benchmark calls it: run in fp32 (the interpreter has no bf16 dot) where it is live
    case32 = cases.Case(**{**case.__dict__, "q": case.q.float(), "kvs": [kv.float() for kv in case.kvs]})
    case32.keys, case32.values = map(list, zip(*(cases.split_kv(kv, D) for kv in case32.kvs)))
    triton = _vllm_triton()
    for sinks, r in variants:
        if triton == "live":
            res = cases.measure(lambda: cases.make_triton(case32, sinks), case32, r, copies=2, rep=0, timed=False)
            assert res["ok"] is True, res
        elif triton == "placeholder":
            _, kd, vd = cases.unit_scales(case32)
            _signature_binds(cases.triton_call_kwargs(case32, 1, torch.empty_like(case32.q),
                                                      cases.triton_buffers(case32), kd, vd, sinks))


@pytest.mark.parametrize("name", cases.SWEEP_CONFIGS)
def test_sweep_candidates_run_and_match(name):
    """The benchmark's launch sweep (num_stages matters only to the compiler: 2 only here)."""
    Hq, Hkv, D = cases.HEADS[name]
    torch.manual_seed(0)
    case = cases.make_case(name, Hq, Hkv, D, 2, 96, device=CPU)
    sw = bench.sweep_case(launch, reference, case, 1, time.time() + 600, timed=False, stages=(2,))
    assert sw["n_candidates"] > 0 and sw["n_wrong"] == 0 and sw["n_failed_to_run"] == 0, sw


def test_prefill_batches_leave_fa3_its_own_split_heuristic():
    timed = [sum(n for _, n in reqs) for _, _, reqs in cases.PREFILL_CASES]
    assert all(cases.fa3_builder_num_splits(T) == 0 for T in timed), timed


@pytest.mark.parametrize("kind, label, reqs", PREFILL_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("name", cases.PREFILL_CONFIGS)
def test_prefill_case(name, kind, label, reqs):
    Hq, Hkv, D = cases.HEADS[name]
    torch.manual_seed(1)
    case = cases.make_prefill_case(name, kind, label, Hq, Hkv, D, reqs, device=CPU)
    cases.check_layout(case)
    new = torch.tensor(case.new)
    assert case.query_start_loc.dtype == case.seq_lens.dtype == case.block_table.dtype == torch.int32
    assert case.query_start_loc.tolist() == [0] + new.cumsum(0).tolist()
    assert case.seq_lens.tolist() == [c + n for c, n in zip(case.context, case.new)]
    assert tuple(case.q.shape) == (case.T, Hq, D)
    bt = case.block_table.flatten()
    assert bt.unique().numel() == bt.numel() and int(bt.max()) < case.keys[0].shape[0], "blocks not distinct"
    visits = sum(c + i + 1 for c, n in zip(case.context, case.new) for i in range(n))
    assert case.flops == 4 * D * Hq * visits
    ref = cases.prefill_ref(case)
    slow = reference.paged_prefill_reference(case.q, case.keys[0], case.values[0], case.block_table, case.seq_lens,
                                             case.query_start_loc, case.scale)
    assert cases.max_err(ref, slow) < 1e-4
    for kw in ({"causal": False}, {"shift": 1}):  # a wrong mask fails the check
        assert not cases.tol_ok(cases.tol_ratio(cases.prefill_ref(case, **kw), ref)), kw
    impl = cases.make_ours_prefill(launch, case)
    impl.out.fill_(float("nan"))
    impl.run(0)
    assert cases.tol_ok(cases.tol_ratio(impl.out, ref)) and cases.tol_ok(cases.tol_ratio(impl.out, slow)), impl.info
    res = cases.measure(lambda: cases.make_ours_prefill(launch, case), case, ref, copies=1, rep=0, timed=False,
                        errfn=cases.tol_ratio, okfn=cases.tol_ok)
    assert res["ok"] is True and res["error"] is None, res
    kv32 = case.kvs[0].float()
    k32, v32 = cases.split_kv(kv32, D)
    case32 = dataclasses.replace(case, q=case.q.float(), kvs=[kv32], keys=[k32], values=[v32])
    triton = _vllm_triton()
    if triton == "live":
        res = cases.measure(lambda: cases.make_triton_prefill(case32), case32, ref, copies=1, rep=0, timed=False,
                            errfn=cases.tol_ratio, okfn=cases.tol_ok)
        assert res["ok"] is True, res
    elif triton == "placeholder":
        _, kd, vd = cases.unit_scales(case32)
        kwargs = cases.triton_call_kwargs(case32, 0, torch.empty_like(case32.q), cases.triton_buffers(case32), kd, vd,
                                          None, max_seqlen_q=case32.max_seqlen_q)
        _signature_binds(kwargs)
        assert kwargs["max_seqlen_q"] > 1 and kwargs["max_seqlen_k"] == case.ctx  # the 2D kernel
    sched = cases.fa3_scheduler_kwargs(case, max_seqlen_q=case.max_seqlen_q, num_splits=0)
    call = cases.fa3_call_kwargs(case, 0, None, None, cases.unit_scales(case), None, max_seqlen_q=case.max_seqlen_q,
                                 num_splits=0)
    assert sched["batch_size"] == case.B
    assert sched["max_seqlen_q"] == call["max_seqlen_q"] == max(case.new)
    assert sched["max_seqlen_k"] == call["max_seqlen_k"] == case.ctx
    assert call["cu_seqlens_q"] is case.query_start_loc and call["seqused_k"] is case.seq_lens
    assert call["causal"] is True and call["block_table"] is case.block_table


@pytest.mark.parametrize("kind", ["fp8", "int8_per_token_head", "fp8_per_token_head"])
def test_quantized_decode_case(kind):
    """bench_attn_paged_kv_quant.py's caches: TRITON_ATTN's layout for the dtype (the per-token-head scales in
    the views vLLM's own ``_ensure_scale_caches`` carves, per KV copy), elements quantized from the case's
    bf16 caches, our kernel on every copy within the tolerance of the reference over the dequantized cache,
    that reference within the quantization's error of the bf16 one, and vLLM's Triton call binding to
    ``unified_attention``'s signature."""
    import bench_attn_paged_kv_quant as quant

    torch.manual_seed(0)
    Hq, Hkv, D = cases.HEADS["smollm2"]
    case = quant.quantize_case(launch, reference, cases.make_case("smollm2", Hq, Hkv, D, 2, 40, device=CPU,
                                                                  copies=2), kind)
    content = 2 * (D + 4) if kind.endswith("head") else 2 * D
    assert case.qkvs[0].shape == (case.keys[0].shape[0], Hkv, 16, content) and case.qkv_bytes == 2 * 40 * Hkv * content
    if kind.endswith("head"):  # the scales sit in each head's padding, as fp32 bytes of the packed tensor
        k_scales = case.qkvs[0].permute(0, 2, 1, 3)[..., D:D + 4].contiguous().view(torch.float32)[..., 0]
        assert torch.equal(k_scales, case.scales[0].k) and (case.scales[0].k != case.scales[1].k).sum() == 0
    ref = quant.quant_reference(reference, case)
    exact = cases.reference_out(reference, case)
    assert 0 < cases.max_err(ref, exact) < (0.05 if kind.startswith("int8") else 0.2)
    impl = quant.make_ours_quant(launch, case)
    for i in range(2):
        impl.out.fill_(float("nan"))
        impl.run(i)
        assert cases.is_ok(cases.max_err(impl.out, ref)), (kind, i, cases.max_err(impl.out, ref))
    if _vllm_triton() is not None:
        captured = {}
        real = sys.modules.get("vllm.v1.attention.ops.triton_unified_attention")
        import vllm.v1.attention.ops.triton_unified_attention as tua

        orig = tua.unified_attention
        tua.unified_attention = lambda **kw: captured.update(kw)
        try:
            quant.make_triton_quant(case).run(0)
        finally:
            tua.unified_attention = orig
        assert real is None or real is tua
        _signature_binds(captured)
        assert captured["kv_quant_mode"].name.lower().startswith(kind.split("_")[0])
