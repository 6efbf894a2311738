"""The backend inside the real vLLM (0.32 CPU build in CI, kernels under Triton's interpreter; 0.26 on the
H200): the plugin registers it in the CUSTOM slot, vLLM resolves and validates it, and vLLM's own metadata
builder and Attention-impl signature drive it: a decode batch built through the builder reaches the
kernel, matches the fp32 reference and is counted; layers and batches it does not serve are counted with
their reasons and left to vLLM's Triton implementation."""

import inspect
import os

import pytest
import torch

pytestmark = pytest.mark.interpret
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the backend's kernels on the CPU need TRITON_INTERPRET=1 (nox sets it)", allow_module_level=True)

from vllm.plugins import load_general_plugins  # noqa: E402

from infera_ops.attn_paged.reference import paged_decode_reference  # noqa: E402
from infera_vllm import coverage  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
HQ, HKV, D, PAGE = 8, 2, 64, 16


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory):
    from transformers import LlamaConfig
    from vllm.engine.arg_utils import EngineArgs

    # the plugin's register(), as vLLM calls it; only this op, so no other op's seam lands in this test process
    # and the self-check off except in the tests of it (tests/perturbed_check below)
    env = {"INFERA_VLLM_OPS": "attn-paged", "INFERA_VLLM_SELF_CHECK": "off"}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        load_general_plugins()
    finally:
        for name, value in saved.items():
            os.environ.pop(name) if value is None else os.environ.__setitem__(name, value)
    model = tmp_path_factory.mktemp("tiny-llama")
    LlamaConfig(vocab_size=256, hidden_size=HQ * D, intermediate_size=256, num_hidden_layers=1,
                num_attention_heads=HQ, num_key_value_heads=HKV, head_dim=D, max_position_embeddings=512,
                ).save_pretrained(model)
    return EngineArgs(model=str(model), skip_tokenizer_init=True, max_model_len=512, dtype="bfloat16",
                      max_num_seqs=8, block_size=PAGE, attention_backend="CUSTOM").create_engine_config()


def test_registered_in_the_custom_slot_and_valid(vllm_config):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from infera_ops.attn_paged.seam import InferaAttentionBackend

    assert vllm_config.attention_config.backend == AttentionBackendEnum.CUSTOM
    cls = AttentionBackendEnum.CUSTOM.get_class()
    assert cls is InferaAttentionBackend and AttentionBackendEnum[cls.get_name()] is AttentionBackendEnum.CUSTOM
    # vLLM's own validation, with whatever fields this version's selector passes
    params = inspect.signature(cls.validate_configuration).parameters
    args = dict(head_size=D, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=PAGE, use_mla=False,
                has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                device_capability=None, attn_type="decoder")
    if torch.cuda.is_available():
        from vllm.platforms import current_platform
        args["device_capability"] = current_platform.get_device_capability()
    assert cls.validate_configuration(**{k: v for k, v in args.items() if k in params}) == []
    assert cls.get_impl_cls().__name__ == "InferaAttentionImpl"


def test_workspace_covers_every_batch_size(vllm_config):
    """The builder's one workspace holds the partials of every batch size it can see, at its split count."""
    from infera_ops.attn_paged import launch
    from infera_ops.attn_paged.seam import split_table, workspace_for

    dev = torch.device(DEV)
    ws = workspace_for(split_table(256, 8, dev, 128), 32, 128, dev)
    caps = [launch.split_cap(b, 8, dev, head_size=128) for b in range(1, 257)]
    assert all(ws.fits(b, 32, 128, cap) for b, cap in enumerate(caps, 1) if cap > 1)  # cap 1: no partials
    # small: batch x cap stays within programs_per_sm x SMs / KV heads rows as batches grow (not 256 x 64)
    rows = launch.decode_defaults(128, dev)[1].programs_per_sm * launch._sm_count(dev) // 8
    assert 0 < ws.max_rows <= rows and ws.out.numel() == ws.max_rows * 32 * 128


def _impl(**kw):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    impl_cls = AttentionBackendEnum.CUSTOM.get_class().get_impl_cls()
    # vLLM's positional order (Attention.__init__): num_heads, head_size, scale, num_kv_heads, alibi_slopes,
    # sliding_window, kv_cache_dtype, logits_soft_cap, attn_type, kv_sharing_target_layer_name, **extra
    args = dict(alibi_slopes=None, sliding_window=None, kv_cache_dtype="auto", logits_soft_cap=None,
                attn_type="decoder", kv_sharing_target_layer_name=None)
    args.update(kw)
    return impl_cls(HQ, D, D ** -0.5, HKV, args.pop("alibi_slopes"), args.pop("sliding_window"),
                    args.pop("kv_cache_dtype"), args.pop("logits_soft_cap"), args.pop("attn_type"),
                    args.pop("kv_sharing_target_layer_name"), **args)


def _decode_batch(vllm_config, lens, query_lens=None, pages=None):
    """vLLM's CommonAttentionMetadata for one step, through the backend's own metadata builder (``pages``:
    block-table columns, default as many as the longest sequence needs)."""
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.registry import AttentionBackendEnum
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    query_lens = query_lens or [1] * len(lens)
    B, pages = len(lens), pages or -(-max(lens) // PAGE)
    nblocks = B * pages + 3
    kv_cache = torch.randn(nblocks, PAGE, HKV, 2 * D, dtype=torch.bfloat16, device=DEV).permute(0, 2, 1, 3)
    block_table = torch.randperm(nblocks, device=DEV)[: B * pages].view(B, pages).to(torch.int32)
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    common = dict(query_start_loc=qsl.to(DEV), query_start_loc_cpu=qsl, seq_lens=torch.tensor(lens, dtype=torch.int32,
                  device=DEV), num_reqs=B, num_actual_tokens=sum(query_lens), max_query_len=max(query_lens),
                  max_seq_len=max(lens), block_table_tensor=block_table,
                  slot_mapping=torch.zeros(sum(query_lens), dtype=torch.int64, device=DEV), causal=True)
    fields = inspect.signature(CommonAttentionMetadata).parameters
    spec = FullAttentionSpec(block_size=PAGE, num_kv_heads=HKV, head_size=D, dtype=torch.bfloat16)
    builder_cls = AttentionBackendEnum.CUSTOM.get_class().get_builder_cls()
    builder = builder_cls(spec, ["model.layers.0.self_attn.attn"], vllm_config, torch.device(DEV))
    md = builder.build(0, CommonAttentionMetadata(**{k: v for k, v in common.items() if k in fields}))
    return md, kv_cache, block_table


def _counts():
    return {(c["route"], c["reason"], c["bucket"], c["at"]): c["count"] for c in coverage.snapshot()["counts"]
            if c["op"] == "attn-paged"}


@pytest.mark.parametrize("sinks", [False, True])
def test_decode_batch_reaches_the_kernel(vllm_config, sinks):
    lens = [50, 1, 33, 100]
    md, kv_cache, block_table = _decode_batch(vllm_config, lens)
    assert md.infera_num_splits >= 1 and md.infera_workspace is not None
    sink = torch.randn(HQ, device=DEV) if sinks else None
    impl = _impl(sinks=sink)
    q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV)
    out = torch.full_like(q, float("nan"))
    before = _counts().get(("kernel", "", "3-4", "call"), 0)
    impl.forward(None, q, None, None, kv_cache, md, out)  # the decode path reads neither layer nor new K/V
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    ref = paged_decode_reference(q, k, v, block_table, md.seq_lens, D ** -0.5, sinks=sink)
    assert (out.float() - ref).abs().max() < 2e-2
    assert _counts()[("kernel", "", "3-4", "call")] == before + 1


def test_sliding_window_layer_uses_vllms_window_convention(vllm_config):
    lens = [70, 20]
    md, kv_cache, block_table = _decode_batch(vllm_config, lens)
    impl = _impl(sliding_window=16)  # vLLM: sliding_window=16 -> keys (16 - 1) behind the query and itself
    q = torch.randn(2, HQ, D, dtype=torch.bfloat16, device=DEV)
    out = torch.empty_like(q)
    impl.forward(None, q, None, None, kv_cache, md, out)
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    ref = paged_decode_reference(q, k, v, block_table, md.seq_lens, D ** -0.5, window_left=15)
    assert (out.float() - ref).abs().max() < 2e-2


def test_layers_it_cannot_serve_are_counted_at_construction(vllm_config):
    before = _counts()
    impl = _impl(alibi_slopes=[0.5] * HQ)
    assert impl._infera_layer_decline == "alibi"
    key = ("fallback", "alibi", "dynamic", "plan")
    assert _counts()[key] == before.get(key, 0) + 1
    assert _impl(kv_cache_dtype="int4_per_token_head")._infera_layer_decline == "kv-cache-dtype"


def _prefill_case(vllm_config, impl_kw=None):
    lens, qlens = [40, 9, 30], [40, 4, 1]  # a prompt, a chunk with cached context, a decode token
    md, kv_cache, block_table = _decode_batch(vllm_config, lens, qlens)
    impl = _impl(**(impl_kw or {}))
    q = torch.randn(sum(qlens), HQ, D, dtype=torch.bfloat16, device=DEV)
    return md, kv_cache, block_table, impl, q


def _prefill_ref(q, kv_cache, block_table, md, **kw):
    from infera_ops.attn_paged.reference import paged_prefill_reference

    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    return paged_prefill_reference(q, k, v, block_table, md.seq_lens, md.query_start_loc, D ** -0.5, **kw)


def test_prefill_and_mixed_batch_reach_the_ragged_kernel(vllm_config, monkeypatch):
    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "kernel")
    md, kv_cache, block_table, impl, q = _prefill_case(vllm_config)
    out = torch.full_like(q, float("nan"))
    before = _counts().get(("kernel", "", "33-64", "call"), 0)
    impl.forward(None, q, None, None, kv_cache, md, out)
    torch.testing.assert_close(out.float(), _prefill_ref(q, kv_cache, block_table, md), atol=2e-2, rtol=2e-2)
    assert _counts()[("kernel", "", "33-64", "call")] == before + 1


def test_the_fa3_route_passes_flash_attns_schedule_for_the_step(vllm_config, monkeypatch):
    """Where FA3 serves prefills, the builder takes each prefill or mixed step's FA3 schedule and split cap
    from vLLM's own FLASH_ATTN builder (none for a decode step) and the route passes both to FA3, as
    FLASH_ATTN does. On the GPU, with FA3 itself, the output is FA3's without the schedule bit for bit; on
    the CPU (no FA3 there) a recorder stands in for FA3 and FLASH_ATTN's builder returns a marked schedule."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

    from infera_ops.attn_paged import seam

    monkeypatch.delenv("INFERA_ATTN_PAGED_PREFILL", raising=False)
    calls, built = [], []
    if DEV == "cpu":
        marked = torch.arange(5, dtype=torch.int32)
        monkeypatch.setattr(seam, "_FA3", [lambda **kw: calls.append(kw), None])
        monkeypatch.setattr(FlashAttentionMetadataBuilder, "build", lambda self, *a, **k: (
            built.append(a), type("FA", (), {"scheduler_metadata": marked, "max_num_splits": 7})())[1])
    elif seam.fa3_unavailable() is not None:
        pytest.skip(f"FA3 does not run here: {seam.fa3_unavailable()}")
    md, kv_cache, block_table, impl, q = _prefill_case(vllm_config)
    assert impl._infera_prefill == "fa3" and md.infera_fa3 is not None
    out = torch.full_like(q, float("nan"))
    impl.forward(None, q, None, None, kv_cache, md, out)
    if DEV == "cpu":
        (call,) = calls
        assert call["scheduler_metadata"] is marked and call["num_splits"] == 7 and len(built) == 1
    else:
        unscheduled = torch.full_like(q, float("nan"))
        md.infera_fa3 = None
        impl.forward(None, q, None, None, kv_cache, md, unscheduled)
        assert torch.equal(out, unscheduled)
    decode_md = _decode_batch(vllm_config, [50, 1, 33])[0]
    assert decode_md.infera_fa3 is None and len(built) == (1 if DEV == "cpu" else 0)  # decode: the kernel's


def test_a_flash_attn_builder_that_cannot_be_built_leaves_fa3_to_schedule_each_call(vllm_config, monkeypatch,
                                                                                     caplog):
    """vLLM's FLASH_ATTN builder refusing this configuration costs the route its schedule, logged, never the
    engine: the backend's builder still builds, and FA3 gets no schedule."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder

    from infera_ops.attn_paged import seam

    monkeypatch.delenv("INFERA_ATTN_PAGED_PREFILL", raising=False)
    calls = []
    monkeypatch.setattr(seam, "_FA3", [lambda **kw: calls.append(kw), None])

    def refuse(self, *args, **kwargs):
        raise ValueError("not this config")

    monkeypatch.setattr(FlashAttentionMetadataBuilder, "__init__", refuse)
    with caplog.at_level("WARNING"):
        md, kv_cache, block_table, impl, q = _prefill_case(vllm_config)
    assert md.infera_fa3 is None and "FLASH_ATTN's metadata builder is not built here" in caplog.text
    impl.forward(None, q, None, None, kv_cache, md, torch.empty_like(q))
    (call,) = calls
    assert call["scheduler_metadata"] is None and call["num_splits"] == 0


@pytest.mark.parametrize("features", [{}, {"sinks": True, "sliding_window": 16}, {"logits_soft_cap": 5.0}])
def test_prefill_route_by_default_is_fa3_where_it_runs(vllm_config, monkeypatch, features):
    """Default (``auto``): FA3 where vLLM's FA3 runs on this GPU (route ``fa3``), else the ragged kernel; the
    same answer either way, sinks, sliding window and soft-cap included."""
    from infera_ops.attn_paged import seam

    monkeypatch.delenv("INFERA_ATTN_PAGED_PREFILL", raising=False)
    kw = dict(features)
    sinks = torch.randn(HQ, device=DEV) if kw.pop("sinks", False) else None
    md, kv_cache, block_table, impl, q = _prefill_case(vllm_config, dict(kw, sinks=sinks))
    route = "fa3" if seam.fa3_unavailable() is None else "kernel"
    assert impl._infera_prefill == route, seam.fa3_unavailable()
    out = torch.full_like(q, float("nan"))
    before = _counts().get((route, "", "33-64", "call"), 0)
    impl.forward(None, q, None, None, kv_cache, md, out)
    ref = _prefill_ref(q, kv_cache, block_table, md, sinks=sinks,
                       window_left=kw.get("sliding_window", 0) - 1, softcap=kw.get("logits_soft_cap", 0.0))
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    assert _counts()[(route, "", "33-64", "call")] == before + 1


class Scales(torch.nn.Module):
    """What vLLM's Triton attention reads from its Attention layer: unit q/k/v scales."""
    _k_scale = torch.ones(1, device=DEV)
    _v_scale = torch.ones(1, device=DEV)
    _q_scale = torch.ones(1, device=DEV)


@pytest.fixture
def self_checked():
    """The self-check on (``first``; ``perturb``: the kernel's outputs scaled by 1.25 when set to the op's
    name), with no bucket checked or declined yet; off again afterwards. Returns the op's Checker."""
    from infera_ops.attn_paged import seam
    from infera_vllm import self_check

    def configure(perturb=""):
        for key in [k for k in coverage._self_checks if k[0] == "attn-paged"]:
            del coverage._self_checks[key]
        seam._check._declined.clear()
        self_check.configure(mode="first", rate=0.0, perturb=perturb, strict=False)
        return seam._check

    yield configure
    configure()
    self_check.configure(mode="off", rate=0.0, perturb="", strict=False)


def _check_entry(bucket):
    return coverage.self_check_entry("attn-paged", bucket)


def _passed(entry) -> bool:
    """One check, passed, within the bound. The error may be exactly 0: with vLLM's FA3 as the reference (the
    H200) both kernels round these short sequences' outputs to the same bf16 values; that the comparison
    can fail is what the perturbed cases show."""
    return (entry["checked"], entry["passed"], entry["failed"]) == (1, 1, 0) and entry["max_error"] < 3e-2


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_self_check_passes_the_kernel_as_it_is(vllm_config, monkeypatch, self_checked, kind):
    """The first call of a bucket also runs vLLM's implementation (the parent's Triton attention; on the CPU
    build the fp32 reference) and passes; the kernel's output is what the call returns."""
    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "kernel")
    self_checked()
    if kind == "decode":
        lens = [50, 1, 33, 100, 7]
        md, kv_cache, block_table = _decode_batch(vllm_config, lens)
        q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV)
        k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
        ref = paged_decode_reference(q, k, v, block_table, md.seq_lens, D ** -0.5)
        impl, bucket = _impl(), "decode 5-8"
    else:
        md, kv_cache, block_table, impl, q = _prefill_case(vllm_config)
        ref, bucket = _prefill_ref(q, kv_cache, block_table, md), "prefill 33-64"
    out = torch.full_like(q, float("nan"))
    before = _counts().get(("kernel", "", bucket.split()[1], "call"), 0)
    impl.forward(Scales(), q, None, None, kv_cache, md, out)
    assert (out.float() - ref).abs().max() < 2e-2
    entry = _check_entry(bucket)
    assert _passed(entry), entry
    assert _counts()[("kernel", "", bucket.split()[1], "call")] == before + 1


def test_self_check_catches_a_wrong_kernel_and_hands_the_bucket_to_vllm(vllm_config, self_checked):
    """With the kernel's outputs perturbed, the first call of the bucket fails its check and returns vLLM's
    result; the next call of that bucket is served by vLLM without running the kernel; both are counted as
    fallback ``self-check-mismatch``. With the check off the same perturbation reaches the output."""
    lens = [50, 1, 33, 100, 7]
    md, kv_cache, block_table = _decode_batch(vllm_config, lens)
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    impl = _impl()
    check = self_checked(perturb="attn-paged")
    before = _counts().get(("fallback", "self-check-mismatch", "5-8", "call"), 0)
    for step in range(2):
        q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV)
        ref = paged_decode_reference(q, k, v, block_table, md.seq_lens, D ** -0.5)
        out = torch.full_like(q, float("nan"))
        impl.forward(Scales(), q, None, None, kv_cache, md, out)
        assert (out.float() - ref).abs().max() < 2e-2, step  # vLLM's answer, not 1.25 x the kernel's
    assert check.declined("decode 5-8")
    entry = _check_entry("decode 5-8")
    assert (entry["checked"], entry["passed"], entry["failed"]) == (1, 0, 1) and entry["max_error"] > 0.1, entry
    assert _counts()[("fallback", "self-check-mismatch", "5-8", "call")] == before + 2

    from infera_vllm import self_check

    self_check.configure(mode="off", rate=0.0, perturb="attn-paged", strict=False)
    check._declined.clear()  # a fresh process with the check off
    out = torch.full_like(q, float("nan"))
    _impl().forward(Scales(), q, None, None, kv_cache, md, out)
    assert (out.float() - 1.25 * ref).abs().max() < 4e-2  # unchecked, the wrong kernel's output goes through


@pytest.mark.parametrize("perturb", ["", "attn-paged"])
def test_self_check_on_an_empty_cache_fills_the_blocks_then_restores_them(vllm_config, self_checked, perturb):
    """vLLM's warm-up batches read a cache with no keys or values yet: both outputs are zero and prove
    nothing. The check then runs both kernels on random keys and values in the call's own blocks (and puts
    the blocks back): a correct kernel passes, a wrong one is caught; the call's own
    output stays what it was (zeros), and the rest of the cache is untouched."""
    lens = [50, 1, 33, 100, 7]
    md, kv_cache, block_table = _decode_batch(vllm_config, lens)
    kv_cache.zero_()
    check = self_checked(perturb=perturb)
    q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV)
    out = torch.full_like(q, float("nan"))
    _impl().forward(Scales(), q, None, None, kv_cache, md, out)
    assert (out == 0).all()
    assert not kv_cache.any()  # the filled blocks are restored
    entry = _check_entry("decode 5-8")
    if perturb:
        assert (entry["checked"], entry["failed"]) == (1, 1) and check.declined("decode 5-8"), entry
    else:
        assert _passed(entry), entry


@pytest.mark.parametrize("perturb", ["", "attn-paged"])
def test_self_check_lengthens_one_key_decode_batches(vllm_config, self_checked, perturb):
    """vLLM's warm-up decode batches give each sequence one key: attention is then a copy of its value in any
    kernel, so the check runs both kernels with every sequence lengthened to as many keys as its block-table
    row holds, on random keys and values in those blocks (put back after): a correct kernel passes, a wrong
    one is caught and the call returns vLLM's result; the call's own output is the one-key answer."""
    lens = [1] * 5
    md, kv_cache, block_table = _decode_batch(vllm_config, lens, pages=6)
    md.max_seq_len = 6 * PAGE  # as vLLM 0.26's warm-up metadata states it: the lengths tensor is what counts
    before = kv_cache.clone()
    check = self_checked(perturb=perturb)
    q = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV)
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    ref = paged_decode_reference(q, k, v, block_table, md.seq_lens, D ** -0.5)
    out = torch.full_like(q, float("nan"))
    _impl().forward(Scales(), q, None, None, kv_cache, md, out)
    assert (out.float() - ref).abs().max() < 2e-2  # the one-key answer (vLLM's, when the check failed)
    assert torch.equal(kv_cache, before)  # the lengthened sequences' blocks are restored
    entry = _check_entry("decode 5-8")
    if perturb:
        assert (entry["checked"], entry["failed"]) == (1, 1) and check.declined("decode 5-8"), entry
    else:
        assert _passed(entry), entry


def test_kv_cache_update_writes_vllms_slots(vllm_config):
    """The KV write the backend does (vLLM's compiled write on GPUs, as FLASH_ATTN's; an index-put on the CPU)
    fills exactly the slots vLLM's slot mapping names, in the views the kernels read."""
    from infera_ops.attn_paged import seam

    if DEV != "cpu":  # vLLM's GPU builds have the compiled write: the Triton one is not what runs here
        assert seam.compiled_cache_write() is not None
    md, kv_cache, _ = _decode_batch(vllm_config, [20, 20])
    impl = _impl()
    before = kv_cache.clone()
    key = torch.randn(5, HKV, D, dtype=torch.bfloat16, device=DEV)
    value = torch.randn(5, HKV, D, dtype=torch.bfloat16, device=DEV)
    slots = torch.tensor([3, 17, 40, -1, 41], dtype=torch.int64, device=DEV)  # -1: a padded token

    class Scales(torch.nn.Module):  # what vLLM's Attention layer carries for the write: unit KV scales
        _k_scale = torch.ones(1, device=DEV)
        _v_scale = torch.ones(1, device=DEV)

    impl.do_kv_cache_update(Scales(), key, value, kv_cache, slots)
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k[slot // PAGE, slot % PAGE], key[i])
            assert torch.equal(v[slot // PAGE, slot % PAGE], value[i])
    touched = torch.zeros(kv_cache.shape[0], PAGE, dtype=torch.bool, device=DEV)
    for slot in (3, 17, 40, 41):
        touched[slot // PAGE, slot % PAGE] = True
    kept = kv_cache.transpose(1, 2)[~touched]
    assert torch.equal(kept, before.transpose(1, 2)[~touched])  # nothing else written


@pytest.mark.skipif(DEV == "cpu", reason="vLLM's CPU build disables its own Triton kernels (no Triton CPU backend), "
                                         "so the Triton implementation prefill is handed to runs on GPUs only")
def test_prefill_handover_goes_to_vllms_triton_attention(vllm_config, monkeypatch):
    from infera_ops.attn_paged.reference import paged_prefill_reference

    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "triton")
    lens, qlens = [40, 9], [40, 9]
    md, kv_cache, block_table = _decode_batch(vllm_config, lens, qlens)
    impl = _impl()

    class Scales(torch.nn.Module):  # what the parent reads from vLLM's Attention layer: unit scales
        _k_scale = torch.ones(1, device=DEV)
        _v_scale = torch.ones(1, device=DEV)
        _q_scale = torch.ones(1, device=DEV)

    q = torch.randn(sum(qlens), HQ, D, dtype=torch.bfloat16, device=DEV)
    out = torch.full_like(q, float("nan"))
    before = _counts()
    impl.forward(Scales(), q, None, None, kv_cache, md, out)
    k, v = kv_cache.transpose(1, 2).split(D, dim=-1)
    ref = paged_prefill_reference(q, k, v, block_table, md.seq_lens, md.query_start_loc, D ** -0.5)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    after = _counts()
    assert sum(n for k, n in after.items() if k[:2] == ("handover", "prefill-handover")) == \
        sum(n for k, n in before.items() if k[:2] == ("handover", "prefill-handover")) + 1


PLATFORM_DEFAULT = r"""
import json, os, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.platforms import current_platform
from vllm.v1.attention.selector import AttentionSelectorConfig
import inspect
fields = inspect.signature(AttentionSelectorConfig).parameters
base = dict(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=False, has_sink=False,
            use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False, attn_type="decoder")
def choose(**kw):
    cfg = AttentionSelectorConfig(**{k: v for k, v in {**base, **kw}.items() if k in fields})
    return current_platform.get_attn_backend_cls(None, attn_selector_config=cfg, num_heads=8)
print("RESULT" + json.dumps({"auto": choose(), "bad_head": choose(head_size=8), "fp8_kv": choose(kv_cache_dtype="fp8"),
                            "int4_kv": choose(kv_cache_dtype="int4_per_token_head"), "head_32": choose(head_size=32),
                            "encoder": choose(attn_type="encoder_only")}))
"""


def test_platform_default_switch_makes_it_vllms_automatic_choice(tmp_path):
    """INFERA_ATTN_PAGED_DEFAULT=1: vLLM's own selector returns the backend when nothing was selected and it
    validates for the layer; a layer it cannot take (head size 8: Triton's validation refuses) gets vLLM's
    own choice, and so does a layer Triton's validation accepts but the kernel would hand to the Triton parent
    (an int4 KV cache, head size 32, encoder-only attention). A quantized cache the kernels read (fp8) takes
    the backend under the explicit switch. Without the switch vLLM's choice is untouched."""
    from infera_vllm.testing import result_json, run_script

    env = {"INFERA_VLLM_OPS": "attn-paged", "INFERA_VLLM_REPORT_DIR": str(tmp_path)}
    on = result_json(run_script(PLATFORM_DEFAULT, env={**env, "INFERA_ATTN_PAGED_DEFAULT": "1"}))
    assert on["auto"] == "infera_ops.attn_paged.seam.InferaAttentionBackend"
    assert on["bad_head"] != on["auto"]
    off = result_json(run_script(PLATFORM_DEFAULT, env=env))
    assert off["auto"] != on["auto"] and "infera" not in off["auto"]
    for declined in ("int4_kv", "head_32", "encoder"):  # validated by Triton, declined by the kernel
        assert on[declined] == off[declined] and "infera" not in on[declined], declined
    assert on["fp8_kv"] == on["auto"] and "infera" not in off["fp8_kv"]


# the plugin's GPU family read as sm90 (the H200's), in a process on the CPU build
AS_SM90 = "import infera_vllm.platform as p\np.detect_gpu_family = lambda: ('sm90', 'stand-in')\n"


def test_on_a_family_it_was_validated_for_it_is_the_automatic_choice_unless_turned_off(tmp_path):
    """sm90 is in ``policy.AUTOMATIC_BY_DEFAULT``: with the switch unset vLLM's own selector returns the
    backend, and it still leaves vLLM the layers the kernel declines; ``INFERA_ATTN_PAGED_DEFAULT=0`` gives
    vLLM its own choice back."""
    from infera_vllm.testing import result_json, run_script

    env = {"INFERA_VLLM_OPS": "attn-paged", "INFERA_VLLM_REPORT_DIR": str(tmp_path)}
    unset = result_json(run_script(AS_SM90 + PLATFORM_DEFAULT, env=env))
    assert unset["auto"] == "infera_ops.attn_paged.seam.InferaAttentionBackend"
    assert "infera" not in unset["fp8_kv"]  # a quantized cache: not the family's default until its matrix judges it
    off = result_json(run_script(AS_SM90 + PLATFORM_DEFAULT, env={**env, "INFERA_ATTN_PAGED_DEFAULT": "0"}))
    assert "infera" not in off["auto"]


def test_doctor_gives_serving_verdict_for_a_bad_switch(tmp_path):
    """The plugin parses the op's switches in doctor as in serving: a bad value is the same bad-switch
    decline, naming the allowed values, before anything is served."""
    import json
    import subprocess
    import sys

    env = {**os.environ, "INFERA_ATTN_PAGED_PREFILL": "sometimes", "INFERA_VLLM_OPS": "attn-paged"}
    proc = subprocess.run([sys.executable, "-m", "infera_vllm", "doctor", "--json"], capture_output=True, text=True,
                          env=env, timeout=300)
    ops = {o["op"]: o for o in json.loads(proc.stdout)["ops"]}
    assert ops["attn-paged"]["reason"] == "bad-switch", ops["attn-paged"]
    assert "auto, fa3, kernel, triton" in ops["attn-paged"]["detail"] and proc.returncode == 1  # it was asked for


class QuantScales(torch.nn.Module):
    """An Attention layer's per-tensor KV scales as a checkpoint sets them (away from 1)."""
    _k_scale = torch.tensor(0.043, device=DEV)
    _v_scale = torch.tensor(0.027, device=DEV)
    _q_scale = torch.ones((), device=DEV)


def _quantized_cache(kind, nblocks):
    """vLLM's KV tensor for ``kind`` in TRITON_ATTN's layout: logical (num_blocks, Hkv, block_size, content),
    NHD physical order; per-token-head caches pad each of K and V by one fp32 scale (4 one-byte elements)."""
    dtype = torch.int8 if kind == "int8_per_token_head" else torch.uint8
    content = 2 * (D + 4) if kind.endswith("per_token_head") else 2 * D
    return torch.zeros(nblocks, PAGE, HKV, content, dtype=dtype, device=DEV).permute(0, 2, 1, 3)


@pytest.mark.parametrize("kind", ["fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"])
def test_quantized_caches_written_and_read_by_the_backend(vllm_config, monkeypatch, kind):
    """A layer with a quantized KV cache is served with bf16 queries (vLLM does not quantize them for it): the
    backend's write fills the cache in TRITON_ATTN's layout (the per-token-head scales in its inline slots,
    through vLLM's own views), and decode and prefill batches over it match the fp32 reference over the
    dequantized cache, and the unquantized keys and values within the quantization's error."""
    from infera_ops.attn_paged import launch
    from infera_ops.attn_paged.reference import paged_prefill_reference

    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "auto")
    impl = _impl(kv_cache_dtype=kind)
    assert impl._infera_layer_decline is None and impl.supports_quant_query_input is False
    assert impl._infera_prefill == "kernel"  # FA3 would take an fp8 cache only with fp8 queries
    lens, qlens = [40, 9, 30], [40, 4, 1]
    md, _, block_table = _decode_batch(vllm_config, lens, qlens)
    kv_cache, layer = _quantized_cache(kind, block_table.numel() + 3), QuantScales()
    keys = torch.randn(sum(lens), HKV, D, dtype=torch.bfloat16, device=DEV)
    values = torch.randn(sum(lens), HKV, D, dtype=torch.bfloat16, device=DEV)
    pos = torch.cat([torch.arange(n) for n in lens]).to(DEV)
    req = torch.cat([torch.full((n,), r) for r, n in enumerate(lens)]).to(DEV)
    slots = block_table[req, pos // PAGE].long() * PAGE + pos % PAGE
    impl.do_kv_cache_update(layer, keys * 0.2, values * 0.1, kv_cache, slots)
    key_cache, value_cache, scales = impl._caches(layer, kv_cache)
    assert scales.mode == (launch.KV_PER_TOKEN_HEAD if kind.endswith("per_token_head") else launch.KV_PER_TENSOR)
    if scales.mode == launch.KV_PER_TOKEN_HEAD:  # the scales live in vLLM's own views of the padding
        assert scales.k is impl._k_scale_cache and (scales.k != 1).sum() == sum(lens) * HKV
    bf16 = torch.zeros(block_table.numel() + 3, PAGE, HKV, 2 * D, dtype=torch.bfloat16, device=DEV)
    bf16[slots // PAGE, slots % PAGE] = torch.cat([keys * 0.2, values * 0.1], dim=-1)
    q = torch.randn(sum(qlens), HQ, D, dtype=torch.bfloat16, device=DEV) * 4
    out = torch.full_like(q, float("nan"))
    impl.forward(layer, q, None, None, kv_cache, md, out)
    args = (block_table, md.seq_lens, md.query_start_loc, D ** -0.5)
    ref = paged_prefill_reference(q, key_cache, value_cache, *args, kv_scales=scales)
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    exact = paged_prefill_reference(q, *bf16.split(D, dim=-1), *args)
    assert (out.float() - exact).abs().max() < (0.05 if kind.startswith("int8") else 0.15) * exact.abs().max()

    decode_md = _decode_batch(vllm_config, lens)[0]
    decode_md.block_table = block_table
    dq = torch.randn(len(lens), HQ, D, dtype=torch.bfloat16, device=DEV) * 4
    dout = torch.full_like(dq, float("nan"))
    impl.forward(layer, dq, None, None, kv_cache, decode_md, dout)
    dref = paged_decode_reference(dq, key_cache, value_cache, block_table, decode_md.seq_lens, D ** -0.5,
                                  kv_scales=scales)
    torch.testing.assert_close(dout.float(), dref, atol=2e-2, rtol=2e-2)
