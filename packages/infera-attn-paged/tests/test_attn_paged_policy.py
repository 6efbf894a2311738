"""The policy's decisions (policy.py): which layers and batches the kernels take, and the reason for the rest."""

import torch

from infera_ops.attn_paged import policy

LAYER_OK = dict(attn_type="decoder", head_size=128, kv_cache_dtype="auto", alibi_slopes=None, use_alibi_sqrt=False,
                chunk_lookback=-1)


def layer(**kw):
    return policy.layer_decline(**{**LAYER_OK, **kw})


def test_layers_served():
    assert layer() is None
    for hs in (64, 80, 96, 128, 256):
        assert layer(head_size=hs) is None
    assert layer(kv_cache_dtype="bfloat16") is None and layer(attn_type="DECODER") is None
    for quantized in ("fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"):
        assert layer(kv_cache_dtype=quantized) is None and policy.kv_quant(quantized) in (1, 2)
    assert policy.kv_quant("auto") == policy.kv_quant("bfloat16") == 0


def test_layers_declined_with_reasons():
    assert layer(attn_type="encoder_only") == "attn-type"
    assert layer(attn_type="encoder") == "attn-type"
    assert layer(attn_type="encoder_decoder") == "attn-type"
    assert layer(alibi_slopes=torch.ones(4)) == "alibi"
    assert layer(use_alibi_sqrt=True) == "alibi"
    assert layer(kv_cache_dtype="int4_per_token_head") == "kv-cache-dtype"  # packed, rotated: not read
    assert layer(kv_cache_dtype="nvfp4") == "kv-cache-dtype"
    # quantized caches on a family whose launch sizes spill with their tiles (the compile test's finding)
    assert layer(kv_cache_dtype="fp8", family="gfx1100") == "kv-cache-dtype-on-family"
    assert layer(kv_cache_dtype="int8_per_token_head", family="gfx942") == "kv-cache-dtype-on-family"
    assert layer(kv_cache_dtype="fp8", family="gfx942") is None and layer(kv_cache_dtype="fp8", family="sm90") is None
    for hs in (32, 112, 192, 512):
        assert layer(head_size=hs) == "head-size"
    assert layer(chunk_lookback=8192) == "chunked-local"
    assert layer(head_size=256, family="gfx1100") == "head-size-on-family"  # the family's tuning file declines it
    assert layer(head_size=256, family="sm90") is None and layer(head_size=256) is None


def test_layers_left_to_vllm_where_the_backend_is_the_automatic_choice():
    """What the selector knows of a layer (attention type, head size, KV-cache dtype, the family's declined
    head sizes) keeps a layer the kernel would decline on vLLM's own choice."""
    assert policy.default_decline("decoder", 128, "auto", "sm90") is None
    assert policy.default_decline(None, 64, None, "sm90") is None  # the selector's defaults: a decoder, auto
    assert policy.default_decline("encoder_only", 128, "auto", "sm90") == "attn-type"
    # a quantized cache the kernels read stays on vLLM's choice until a family's matrix judges it
    assert policy.AUTOMATIC_QUANTIZED_KV == ()
    assert policy.default_decline("decoder", 128, "fp8_e4m3", "sm90") == "kv-cache-dtype-opt-in"
    assert policy.default_decline("decoder", 128, "int4_per_token_head", "sm90") == "kv-cache-dtype"
    assert policy.default_decline("decoder", 192, "auto", "sm90") == "head-size"
    assert policy.default_decline("decoder", 256, "auto", "gfx1100") == "head-size-on-family"  # its file's
    assert policy.default_decline("decoder", 256, "auto", "sm90") is None


def test_quantized_caches_prefill_on_the_kernel_not_fa3():
    """FA3 reads an fp8 cache only with fp8 queries; the backend keeps them bf16, so FA3 takes plain caches."""
    assert policy.prefill_on_fa3("auto", None, 128) and policy.prefill_on_fa3("fa3", None, 128, "bfloat16")
    for quantized in ("fp8", "int8_per_token_head"):
        assert not policy.prefill_on_fa3("auto", None, 128, quantized)
        assert not policy.prefill_on_fa3("fa3", None, 128, quantized)


def batch(q=None, **kw):
    args = dict(decode=True, prefill_route="kernel", extras_present=False, quantized_output=False)
    return policy.batch_decline(torch.empty(4, 8, 64, dtype=torch.bfloat16) if q is None else q, **{**args, **kw})


def test_batches():
    assert batch() is None and batch(decode=False) is None
    assert batch(torch.empty(4, 8, 64, dtype=torch.float16)) is None
    assert batch(torch.empty(4, 8, 64, dtype=torch.float32)) == "dtype"
    assert batch(decode=False, prefill_route="triton") == "prefill-handover"
    assert batch(decode=False, prefill_route="fa3") == "fa3"
    assert batch(prefill_route="triton") is None and batch(prefill_route="fa3") is None  # decode stays on the kernel
    assert batch(decode=False, prefill_route="fa3", causal=False) == "non-causal"
    assert batch(extras_present=True) == "mm-prefix-or-rswa"
    assert batch(quantized_output=True) == "output-quant"
    assert batch(decode=False, causal=False) == "non-causal"
    assert batch(decode=False, causal=torch.tensor([True, False])) == "non-causal"  # per-request flags
    assert batch(causal=False) is None  # one decode token sees its whole sequence either way
    assert "prefill-handover" in policy.HANDOVERS and policy.ROUTES == ("fa3",)


def test_fa3_takes_prefill_where_it_runs():
    assert policy.prefill_on_fa3("auto", None, 128) and policy.prefill_on_fa3("fa3", None, 64)
    assert not policy.prefill_on_fa3("auto", "needs Hopper", 128)  # elsewhere: the ragged kernel
    assert not policy.prefill_on_fa3("kernel", None, 128) and not policy.prefill_on_fa3("triton", None, 128)
    assert policy.prefill_on_fa3("auto", None, 256) and not policy.prefill_on_fa3("auto", None, 260)


def test_decode_or_ragged():
    assert policy.is_decode(max_query_len=1, num_actual_tokens=4, num_seqs=4)
    assert policy.is_decode(max_query_len=1, num_actual_tokens=8, num_seqs=8)  # padded CUDA-graph batch
    assert not policy.is_decode(max_query_len=7, num_actual_tokens=10, num_seqs=4)
    assert not policy.is_decode(max_query_len=1, num_actual_tokens=3, num_seqs=4)  # a request without a token


def test_prefill_switch(monkeypatch):
    import pytest

    monkeypatch.delenv("INFERA_ATTN_PAGED_PREFILL", raising=False)
    assert policy.prefill_route() == "auto"
    for value in ("fa3", "kernel", "triton"):
        monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", value)
        assert policy.prefill_route() == value
    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "Kernel")  # the plugin's rules: choices case-insensitive
    assert policy.prefill_route() == "kernel"
    monkeypatch.setenv("INFERA_ATTN_PAGED_PREFILL", "0")
    with pytest.raises(ValueError, match="INFERA_ATTN_PAGED_PREFILL='0': expected one of auto, fa3, kernel, triton"):
        policy.prefill_route()
    monkeypatch.delenv("INFERA_ATTN_PAGED_DEFAULT", raising=False)
    assert policy.AUTOMATIC_BY_DEFAULT == ("sm90",)  # the families the validation matrix judged (docs/validate.md)
    assert policy.platform_default("sm90") and not policy.platform_default("gfx942")  # elsewhere off unless asked
    monkeypatch.setenv("INFERA_ATTN_PAGED_DEFAULT", "1")
    assert policy.platform_default("gfx942")
    monkeypatch.setenv("INFERA_ATTN_PAGED_DEFAULT", "yes")  # every spelling the plugin's flags take
    assert policy.platform_default(None)
    monkeypatch.setenv("INFERA_ATTN_PAGED_DEFAULT", "sometimes")
    with pytest.raises(ValueError, match="INFERA_ATTN_PAGED_DEFAULT='sometimes': expected 1/0, true/false"):
        policy.platform_default("sm90")
    # a validated family: on when the switch is unset (or blank), off when it says 0
    monkeypatch.setattr(policy, "AUTOMATIC_BY_DEFAULT", ("sm90",))
    for raw, family, want in ((None, "sm90", True), (" ", "sm90", True), ("0", "sm90", False),
                              (None, "gfx942", False), ("1", "gfx942", True)):
        if raw is None:
            monkeypatch.delenv("INFERA_ATTN_PAGED_DEFAULT", raising=False)
        else:
            monkeypatch.setenv("INFERA_ATTN_PAGED_DEFAULT", raw)
        assert policy.platform_default(family) is want, (raw, family)


def test_doctor_plan_per_layer():
    from infera_ops.attn_paged.seam import plan
    from infera_vllm.model_sites import Site

    def site(**attrs):
        return Site("attention", "model.layers.0.self_attn.attn", {"num_heads": 9, "num_kv_heads": 3, "head_size": 64,
                                                                  "dtype": "bfloat16", **attrs})

    assert plan(site()) is None
    assert plan(site(head_size=112)).code == "head-size"
    assert plan(site(dtype="float32")).code == "dtype"


def test_tuning_file_by_head_size(tmp_path, monkeypatch):
    import json

    import pytest

    from infera_ops.attn_paged import policy

    entry = dict(block_n=64, num_warps=4, num_stages=2, programs_per_sm=8, split_keys=256, pdl=False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"decode": {"64": entry, "128": dict(entry, block_n=32)}, "measured": {"gpu": "x"}}))
    monkeypatch.setenv("INFERA_ATTN_PAGED_TUNING", str(path))
    table = policy.load("sm90")
    assert table[64] == policy.DecodeSettings(**entry) and table[128].block_n == 32
    assert policy.decode_settings(96, "cpu").block_n == 32  # 80 and 96 take 128's entry
    assert policy.decode_settings(256, "cpu") is None  # above every listed size: the defaults
    path.write_text(json.dumps({"decode": {"64": {"block_n": 64}}}))
    policy._table.cache_clear()
    with pytest.raises(policy.TuningError, match="not a decode tuning file"):
        policy.load("sm90")
    monkeypatch.setenv("INFERA_ATTN_PAGED_TUNING", str(tmp_path / "missing.json"))
    with pytest.raises(policy.TuningError, match="INFERA_ATTN_PAGED_TUNING"):
        policy.load("sm90")
    policy._table.cache_clear()


def test_an_unusable_tuning_file_declines_the_op_bad_tuning(tmp_path, monkeypatch):
    """As the other ops name it: the decline's code and the reader's message, no activate-error."""
    from types import SimpleNamespace

    import pytest

    pytest.importorskip("vllm")
    from infera_ops.attn_paged import seam

    monkeypatch.setenv("INFERA_ATTN_PAGED_TUNING", str(tmp_path / "missing.json"))
    policy._table.cache_clear()
    why = seam.check(SimpleNamespace(env=SimpleNamespace(gpu_family="sm90")))
    policy._table.cache_clear()
    assert why is not None and why.code == "bad-tuning" and "INFERA_ATTN_PAGED_TUNING" in why.detail, why


def test_tuning_file_prefill_section_and_reduce_warps(tmp_path, monkeypatch):
    import json

    import pytest

    from infera_ops.attn_paged import launch, policy

    decode = dict(block_n=32, num_warps=8, num_stages=1, programs_per_sm=16, split_keys=128, pdl=False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"decode": {"128": dict(decode, reduce_warps=8)},
                                "prefill": {"64": dict(block_m=128, block_n=64, num_warps=8, num_stages=1),
                                            "128": dict(block_m=16, block_n=32, num_warps=16, num_stages=1)}}))
    monkeypatch.setenv("INFERA_ATTN_PAGED_TUNING", str(path))
    policy._table.cache_clear()
    try:
        assert launch.decode_defaults(128, "cpu")[0] == launch.LaunchConfig(32, 8, 1, reduce_warps=8)
        # the default ceiling
        assert launch.decode_defaults(128, "cpu")[1] == launch.SplitPolicy(16, 128, max_splits=64)
        path.write_text(json.dumps({"decode": {"128": dict(decode, max_splits=128)}}))
        policy._table.cache_clear()
        assert launch.decode_defaults(128, "cpu")[1].max_splits == 128
        assert launch.decode_defaults(128, "cpu")[0].unsplit is None
        path.write_text(json.dumps({"decode": {"128": dict(decode, unsplit=dict(block_n=128, num_warps=4,
                                                                                 num_stages=3))}}))
        policy._table.cache_clear()
        assert launch.decode_defaults(128, "cpu")[0].unsplit == launch.LaunchConfig(128, 4, 3)
        path.write_text(json.dumps({"decode": {"128": dict(decode, unsplit=dict(block_n=128, num_warps=4,
                                                                                 num_stages=3),
                                                           unsplit_by_group={"3": dict(block_n=64, num_warps=4,
                                                                                       num_stages=2),
                                                                             "8": None})}}))
        policy._table.cache_clear()
        cfg = launch.decode_defaults(128, "cpu")[0]
        assert cfg.for_slices(1, 3) == launch.LaunchConfig(64, 4, 2)  # the group's own
        assert cfg.for_slices(1, 8) == cfg  # null: the split sizes
        assert cfg.for_slices(1, 4) == launch.LaunchConfig(128, 4, 3)  # a group not listed: ``unsplit``
        assert cfg.for_slices(2, 3) == cfg  # several slices: the split sizes whatever the group
        path.write_text(json.dumps({"decode": {"128": dict(decode, unsplit_by_group=[64, 4, 2])}}))
        policy._table.cache_clear()
        with pytest.raises(policy.TuningError, match="unsplit_by_group must map"):
            policy.load("sm90")
        path.write_text(json.dumps({"decode": {"128": dict(decode, unsplit=dict(block_n=128))}}))
        policy._table.cache_clear()
        with pytest.raises(policy.TuningError, match="unsplit must hold exactly"):
            policy.load("sm90")
        path.write_text(json.dumps({"decode": {"128": dict(decode, reduce_warps=8)},
                                    "prefill": {"64": dict(block_m=128, block_n=64, num_warps=8, num_stages=1),
                                                "128": dict(block_m=16, block_n=32, num_warps=16, num_stages=1)}}))
        policy._table.cache_clear()
        assert policy.prefill_settings(80, "cpu") == policy.PrefillSettings(16, 32, 16, 1)  # 80 takes 128's
        assert policy.prefill_settings(256, "cpu") is None
        # BLOCK_M is at least the group's power of two; a head size the file leaves out takes the defaults
        assert launch.prefill_config(128, 4, "cpu") == (16, launch.LaunchConfig(block_n=32, num_warps=16, num_stages=1))
        assert launch.prefill_config(128, 32, "cpu")[0] == 32
        assert launch.prefill_config(256, 2, "cpu") == launch.prefill_config(256, 2)
        path.write_text(json.dumps({"decode": {}, "prefill": {"64": {"block_m": 16}}}))
        policy._table.cache_clear()
        with pytest.raises(policy.TuningError, match="bad prefill section"):
            policy.load("sm90")
    finally:
        policy._table.cache_clear()


def test_packaged_tuning_files_parse():
    from importlib import resources

    from infera_ops.attn_paged import policy

    files = [f.name for f in resources.files("infera_ops.attn_paged").joinpath("tuning").iterdir()
             if f.name.endswith(".json")]
    assert {"sm90.json", "gfx942.json", "gfx1100.json", "gfx1151.json", "gfx1201.json"} <= set(files)
    for name in files:
        decode, prefill, _ = policy._parse(
            resources.files("infera_ops.attn_paged").joinpath("tuning", name).read_text(), name)
        assert all(s.num_warps in (4, 8, 16) and s.reduce_warps in (4, 8) for s in decode.values()), name
        assert all(s.block_m >= 16 and s.block_n >= 16 for s in prefill.values()), name


def test_head_sizes_a_family_declines(tmp_path, monkeypatch):
    """RDNA3's files decline head size 256 (every launch spills there); other families and sizes serve; a
    malformed section is a clear error."""
    import json

    import pytest

    from infera_ops.attn_paged import policy

    monkeypatch.delenv("INFERA_ATTN_PAGED_TUNING", raising=False)
    policy._table.cache_clear()
    try:
        assert "spills" in policy.declined_head_size(256, "gfx1100")
        assert "spills" in policy.declined_head_size(256, "gfx1151")
        assert policy.declined_head_size(128, "gfx1100") is None
        assert policy.declined_head_size(256, "gfx1201") is None and policy.declined_head_size(256, "sm90") is None
        path = tmp_path / "t.json"
        path.write_text(json.dumps({"decode": {}, "declined_head_sizes": ["256"]}))
        monkeypatch.setenv("INFERA_ATTN_PAGED_TUNING", str(path))
        with pytest.raises(policy.TuningError, match="declined_head_sizes"):
            policy.load("sm90")
    finally:
        policy._table.cache_clear()
