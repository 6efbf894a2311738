"""The policy (policy.py): which calls the kernel takes, with the reason for the rest, and the tuning file / switches
(plain torch; no kernel runs)."""

import json

import pytest
import torch

from infera_ops.moe_decode import launch, policy


def _args(M=4, H=64, I=32, E=4, dtype=torch.bfloat16, **over):
    args = dict(hidden_states=torch.randn(M, H, dtype=dtype), w1=torch.randn(E, 2 * I, H, dtype=dtype),
                w2=torch.randn(E, H, I, dtype=dtype), topk_ids=torch.zeros(M, 2, dtype=torch.int32),
                activation="silu", expert_map=None, apply_router_weight_on_input=False, a1q_scale=None,
                w1_bias=None, w2_bias=None, serves=policy.Tuning(max_tokens=over.pop("max_tokens", 16)).serves)
    args.update(over)
    return args


@pytest.mark.parametrize("over, reason", [
    ({}, None),
    ({"M": 16}, None),
    ({"M": 17}, "tokens-above-threshold"),
    ({"max_tokens": 0, "M": 1}, "tokens-above-threshold"),
    ({"dtype": torch.float32}, "dtype"),
    ({"activation": "gelu"}, "activation"),
    ({"expert_map": torch.arange(4)}, None),  # expert parallel: the kernel serves the local experts
    ({"expert_map": torch.arange(4).view(2, 2)}, "expert-map"),
    ({"apply_router_weight_on_input": True}, "router-weight-on-input"),
    ({"w1_bias": torch.zeros(4, 64)}, "bias"),
    ({"a1q_scale": torch.ones(1)}, "quantized-activations"),
])
def test_policy_decisions(over, reason):
    shape = {k: over.pop(k) for k in ("M", "dtype") if k in over}
    assert policy.decline_reason(**_args(**shape, **over)) == reason


def _fp8(**over):
    args = _args()
    E, two_i, H = args["w1"].shape
    args.update(w1=args["w1"].to(torch.float8_e4m3fn), w2=args["w2"].to(torch.float8_e4m3fn),
                scales=launch.ExpertScales(torch.rand(E, two_i // 32, H // 32), torch.rand(E, H // 32, two_i // 64),
                                           (32, 32)))
    args.update(over)
    return args


def test_fp8_policy_decisions():
    """FP8 weights with block scales are served; without scales they are another dtype; scales of a layout the
    kernels cannot read, or of another dtype, decline; a family with no FP8 tuning hands them over."""
    assert policy.decline_reason(**_fp8()) is None
    assert policy.decline_reason(**_fp8(scales=None)) == "weight-dtype"
    bad = _fp8()["scales"]
    assert policy.decline_reason(**_fp8(scales=bad._replace(block=(16, 32)))) == "weight-scales"
    assert policy.decline_reason(**_fp8(scales=bad._replace(w2=bad.w2.half()))) == "weight-scales"
    assert policy.decline_reason(**_fp8(scales=bad._replace(block=(32, 24)))) == "weight-scales"
    assert policy.decline_reason(**_fp8(serves=None)) == "fp8-not-tuned"
    assert policy.decline_reason(**_fp8(a1q_scale=torch.ones(1))) == "quantized-activations"


def test_fp8_tuning_section(tmp_path, monkeypatch):
    """The file's "fp8" section is FP8 layers' own tuning, in the split forms only; without one FP8 layers are
    not tuned unless the threshold is set."""
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS", raising=False)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"max_tokens": 4, "fp8": {"max_tokens": 8, "config": {"form": "split_sum"}}}))
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(path))
    tuned = policy.load("sm90")
    assert tuned.fp8.max_tokens == 8 and tuned.fp8.config_for(1).form == "split_sum"
    path.write_text(json.dumps({"max_tokens": 4, "fp8": {"max_tokens": 8, "config": {"form": "stream"}}}))
    with pytest.raises(policy.TuningError, match="FP8 launches in form stream"):
        policy.load("sm90")
    path.write_text(json.dumps({"max_tokens": 4}))
    assert policy.load("sm90").fp8 is None
    monkeypatch.setenv("INFERA_MOE_DECODE_MAX_TOKENS", "2")
    assert policy.load("sm90").fp8.max_tokens == 2


@pytest.mark.parametrize("over, reason", [
    ({"activation": "swigluoai"}, "activation"),
    ({"w1_bias": torch.zeros(4, 64)}, "bias"),
    ({"dtype": torch.float32}, "dtype"),
])
def test_what_the_kernel_cannot_compute_outranks_the_token_count(over, reason):
    """A call the kernel could never take is counted under its reason (a fallback), not handed over as too
    large: gpt-oss's clamped SwiGLU at 64 tokens is `activation`."""
    shape = {k: over.pop(k) for k in ("dtype",) if k in over}
    assert policy.decline_reason(**_args(M=64, **shape, **over)) == reason


def test_site_decline_matches_the_per_call_reasons():
    assert policy.site_decline({"dtype": "bfloat16", "activation": "silu", "bias": False}) is None
    assert policy.site_decline({"dtype": "torch.float16", "activation": "SiLU"}) is None
    assert policy.site_decline({"dtype": "bfloat16", "activation": "swigluoai", "bias": True})[0] == "activation"
    assert policy.site_decline({"dtype": "bfloat16", "activation": "silu", "bias": True})[0] == "bias"
    assert policy.site_decline({"dtype": "float32", "activation": "silu"})[0] == "dtype"


def test_policy_refuses_mismatched_layout():
    args = _args()
    args["w2"] = torch.randn(4, 64, 48, dtype=torch.bfloat16)  # I of w2 != half of w13's rows
    assert policy.decline_reason(**args) == "layout"
    args = _args()
    args["w1"] = torch.randn(4, 64, 64, dtype=torch.bfloat16).transpose(1, 2)  # not unit stride along H
    assert policy.decline_reason(**args) == "layout"


def test_tokens_above_threshold_is_a_handover():
    assert "tokens-above-threshold" in policy.HANDOVERS and "dtype" not in policy.HANDOVERS


def test_tuning_files_and_switches(monkeypatch, tmp_path):
    monkeypatch.delenv("INFERA_MOE_DECODE_TUNING", raising=False)
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS", raising=False)
    cpu = policy.load("cpu")
    assert cpu.max_tokens == 16 and cpu.source == "tuning/cpu.json" and cpu.config.block_i == 16
    assert policy.load("gfx1151") is None  # no file: not tuned
    monkeypatch.setenv("INFERA_MOE_DECODE_MAX_TOKENS", "8")
    assert policy.load("gfx1151").max_tokens == 8 and policy.load("cpu").max_tokens == 8
    own = tmp_path / "t.json"
    own.write_text(json.dumps({"max_tokens": 4, "config": {"block_n": 128}}))
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(own))
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS")
    got = policy.load("sm90")
    assert got.max_tokens == 4 and got.config.block_n == 128 and got.source == str(own)


@pytest.mark.parametrize("text, match", [
    ("{", "not JSON"), ('{"max_tokens": -1}', "max_tokens"), ('{"max_tokens": 4, "config": {"block_q": 1}}', "config"),
])
def test_bad_tuning_is_a_clear_error(monkeypatch, tmp_path, text, match):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(bad))
    with pytest.raises(policy.TuningError, match=match):
        policy.load("sm90")


def test_bad_threshold_switch(monkeypatch):
    monkeypatch.setenv("INFERA_MOE_DECODE_MAX_TOKENS", "many")
    with pytest.raises(policy.TuningError, match="INFERA_MOE_DECODE_MAX_TOKENS"):
        policy.load("cpu")


def test_served_token_counts_per_expert_shape(monkeypatch, tmp_path):
    """Measured shapes take the token counts they won at; others the file's max_tokens; the switch overrides."""
    own = tmp_path / "t.json"
    qwen, small = policy.shape_key(128, 2048, 768, 8), policy.shape_key(4, 64, 32, 2)
    own.write_text(json.dumps({"max_tokens": 1, "served": {qwen: [1, 2, 8, 16], small: [1, 2, 8]}}))
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(own))
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS", raising=False)
    got = policy.load("sm90")
    assert [got.serves(m, 128, 2048, 768, 8) for m in (1, 2, 3, 4, 5, 8, 16, 17)] == [
        True, True, False, False, True, True, True, False]
    assert [got.serves(m, 64, 2048, 1408, 6) for m in (1, 2)] == [True, False]
    assert got.largest_served == 16
    assert policy.decline_reason(**_args(M=3, serves=got.serves)) == "tokens-above-threshold"
    assert policy.decline_reason(**_args(M=5, serves=got.serves)) is None
    monkeypatch.setenv("INFERA_MOE_DECODE_MAX_TOKENS", "4")
    forced = policy.load("sm90")
    assert forced.serves(3, 128, 2048, 768, 8) and forced.serves(4, 64, 2048, 1408, 6)
    assert not forced.serves(5, 128, 2048, 768, 8)
    own.write_text(json.dumps({"max_tokens": 1, "served": {qwen: ["many"]}}))
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS")
    with pytest.raises(policy.TuningError, match="served"):
        policy.load("sm90")


def test_blocks_by_token_count(monkeypatch, tmp_path):
    own = tmp_path / "t.json"
    own.write_text(json.dumps({"max_tokens": 16, "config": {"block_i": 64},
                               "by_tokens": {"8": {"block_i": 32}, "2": {"block_i": 16}}}))
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(own))
    got = policy.load("sm90")
    assert [got.config_for(m).block_i for m in (1, 2, 3, 8, 9, 16)] == [16, 16, 32, 32, 64, 64]
    own.write_text(json.dumps({"max_tokens": 16, "by_tokens": {"two": {}}}))
    with pytest.raises(policy.TuningError, match="by_tokens"):
        policy.load("sm90")


def test_blocks_by_expert_shape(monkeypatch, tmp_path):
    """A shape's own launch serves exactly the measured bound it was won at (the calls whose smallest
    measured bound >= M is that one), the file's by_tokens the shape's other token counts; a forced
    threshold (no measured file in play) ignores them."""
    own = tmp_path / "t.json"
    mixtral = policy.shape_key(8, 4096, 14336, 2)
    own.write_text(json.dumps({"max_tokens": 16, "config": {"block_i": 64},
                               "by_tokens": {"8": {"block_i": 32}},
                               "by_shape": {mixtral: {"2": {"form": "persistent", "block_i": 16}}}}))
    monkeypatch.setenv("INFERA_MOE_DECODE_TUNING", str(own))
    monkeypatch.delenv("INFERA_MOE_DECODE_MAX_TOKENS", raising=False)
    got = policy.load("sm90")
    assert [(got.config_for(m, mixtral).form, got.config_for(m, mixtral).block_i) for m in (1, 2, 3, 9)] == [
        ("split", 32), ("persistent", 16), ("split", 32), ("split", 64)]
    assert got.config_for(1, policy.shape_key(128, 2048, 768, 8)).block_i == 32
    assert got.config_for(1).block_i == 32
    own.write_text(json.dumps({"max_tokens": 16, "by_shape": {mixtral: {"2": {"form": "atomic"}}}}))
    with pytest.raises(policy.TuningError, match="by_shape"):
        policy.load("sm90")
