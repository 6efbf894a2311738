"""The hand-overs to vLLM's own kernels (seam.py): eager launch cost (while vLLM dispatches, and inside the ops
when a compiled graph runs eagerly), per-head norms while compiling, and the fused add's shapes where vllm_c
measured faster. vLLM's real kernels serve; no Triton kernel runs here."""

import pytest
import torch

seam = pytest.importorskip("infera_ops.norm.seam")
policy = pytest.importorskip("infera_ops.norm.policy")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # vLLM's CUDA build has no CPU kernels


def _x(tokens, hidden=576):
    return torch.randn(tokens, hidden, dtype=torch.bfloat16, device=DEVICE)


@pytest.mark.parametrize("tokens, eager_min, expected", [
    (16, 4096, "eager-launch-cost"), (4095, 4096, "eager-launch-cost"), (4096, 4096, None), (16, 0, None),
])
def test_eager_calls_below_the_threshold_are_declined(tokens, eager_min, expected):
    x = _x(tokens)
    got = policy.decline_reason(x, torch.randn(576, dtype=torch.bfloat16, device=DEVICE), None, allow_cpu=True,
                                eager_min_tokens=eager_min)
    assert got == expected


def test_fake_tensors_are_not_declined_for_launch_cost():
    """While vLLM compiles, the choice is baked into a graph that CUDA graphs replay: no launch cost."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(16, 576, dtype=torch.bfloat16)
        w = torch.empty(576, dtype=torch.bfloat16)
        assert policy.decline_reason(x, w, None, allow_cpu=True, eager_min_tokens=4096) is None


@pytest.mark.parametrize("tokens, hidden, hands_over", [
    (1024, 4096, True), (512, 7168, True), (2048, 8192, True), (256, 8192, False), (4096, 7168, False),
    (1024, 2048, False), (1024, 576, False),
])
def test_fused_add_band_handed_to_vllm_c(tokens, hidden, hands_over):
    assert policy.vllm_c_hands_over(tokens, hidden) is hands_over


def test_fused_add_op_hands_over_in_place_and_counts(monkeypatch):
    vllm_c = seam._vllm_c_fused_add()
    if vllm_c is None:
        pytest.skip("this vLLM build has no torch.ops._C.fused_add_rms_norm")
    seen = []
    monkeypatch.setitem(seam._handover, "vllm_c", vllm_c)
    monkeypatch.setitem(seam._handover, "count", lambda reason, x: seen.append((reason, x.shape[0])))
    x, r = _x(512, 4096), _x(512, 4096)
    w = torch.randn(4096, dtype=torch.bfloat16, device=DEVICE)
    from infera_ops.norm.reference import fused_add_rms_norm_reference

    y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
    torch.ops.infera.fused_add_rms_norm_(x, r, w, 1e-6)
    assert seen == [("vllm-c-faster", 512)]
    torch.testing.assert_close(r.float(), h_ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x.float(), y_ref.float(), atol=2e-2, rtol=2e-2)


def _vllm_c_or_skip(name):
    op = seam._vllm_c(name)
    if op is None:
        pytest.skip(f"this vLLM build has no torch.ops._C.{name}")
    return op


def test_eager_calls_inside_the_ops_go_to_vllm_c(monkeypatch):
    """A compiled graph run outside CUDA graphs (a prefill past the capture sizes) reaches the ops with the
    kernel baked in: below the eager threshold each call goes to vllm_c's C++ op, counted, results exact."""
    seen = []
    monkeypatch.setitem(seam._handover, "vllm_c", _vllm_c_or_skip("fused_add_rms_norm"))
    monkeypatch.setitem(seam._handover, "vllm_c_rms", _vllm_c_or_skip("rms_norm"))
    monkeypatch.setitem(seam._handover, "eager_min", policy.EAGER_NEVER)
    monkeypatch.setitem(seam._handover, "count", lambda reason, x: seen.append((reason, x.shape[0])))
    monkeypatch.setitem(seam._self_check, "check", None)
    from infera_ops.norm.reference import fused_add_rms_norm_reference, rms_norm_reference

    x, r = _x(37, 1024), _x(37, 1024)
    w = torch.randn(1024, dtype=torch.bfloat16, device=DEVICE)
    y = torch.ops.infera.rms_norm(x, w, 1e-6)
    torch.testing.assert_close(y.float(), rms_norm_reference(x, w, 1e-6).float(), atol=2e-2, rtol=2e-2)
    y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
    torch.ops.infera.fused_add_rms_norm_(x, r, w, 1e-6)
    torch.testing.assert_close(r.float(), h_ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x.float(), y_ref.float(), atol=2e-2, rtol=2e-2)
    assert seen == [("eager-launch-cost", 37), ("eager-launch-cost", 37)]


@pytest.mark.parametrize("tokens, capturing, checking, eager_min, expected", [
    (37, False, False, policy.EAGER_NEVER, True),
    (37, True, False, policy.EAGER_NEVER, False),  # captured into a CUDA graph: replays cost no host time
    (37, False, True, policy.EAGER_NEVER, False),  # the self-check looks at the kernel's first call
    (4096, False, False, 4096, False),  # INFERA_NORM_EAGER_MIN_TOKENS=4096: from there the kernel serves
    (4095, False, False, 4096, True),
    (1, False, False, 0, False),  # 0: every eager call on the kernel
])
def test_eager_hand_over_rule(monkeypatch, tokens, capturing, checking, eager_min, expected):
    monkeypatch.setitem(seam._handover, "eager_min", eager_min)
    assert seam._eager_to_vllm_c(_x(tokens), capturing, checking) is expected


@pytest.mark.parametrize("raw, expected", [("", policy.EAGER_NEVER), ("0", 0), (" 512 ", 512), ("lots", None),
                                           ("-1", None)])
def test_eager_threshold_switch(monkeypatch, raw, expected):
    monkeypatch.setenv("INFERA_NORM_EAGER_MIN_TOKENS", raw)
    if expected is None:  # the plugin refuses it first: the op is declined 'bad-switch' with this message
        with pytest.raises(ValueError, match="INFERA_NORM_EAGER_MIN_TOKENS"):
            policy.eager_min_tokens()
    else:
        assert policy.eager_min_tokens() == expected


@pytest.mark.parametrize("shape, fake, switch_on, expected", [
    ((16, 8, 128), True, True, "per-head-fusion"),  # Qwen3's q norm over [tokens, heads, head_dim], compiling
    ((16, 2, 8, 128), True, True, "per-head-fusion"),
    ((16, 4096), True, True, None),  # the residual stream's norm: the kernel, in the graph
    ((1, 16, 576), True, True, None),  # [batch, seq, hidden]: not per head
    ((16, 8, 128), False, True, None),  # real tensors (CUDA-graph capture without Inductor): the kernel
    ((16, 8, 128), True, False, None),  # INFERA_NORM_PER_HEAD_KERNEL=1
])
def test_per_head_norms_left_to_inductor_while_compiling(shape, fake, switch_on, expected):
    """While compiling, a per-head norm goes to vLLM's next provider: Inductor then fuses it with the split
    and RoPE around it (docs/operators/norm.md); everything else stays on the kernel."""
    from contextlib import nullcontext

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() if fake else nullcontext():
        x = torch.randn(*shape, dtype=torch.bfloat16)
        w = torch.randn(shape[-1], dtype=torch.bfloat16)
        got = policy.decline_reason(x, w, None, allow_cpu=True, per_head_to_vllm=switch_on)
    assert got == expected


def test_per_head_rule_leaves_the_fused_add_alone():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, r = torch.empty(2, 8, 4096, dtype=torch.bfloat16), torch.empty(2, 8, 4096, dtype=torch.bfloat16)
        assert policy.decline_reason(x, None, None, r, allow_cpu=True, per_head_to_vllm=True) is None


@pytest.mark.parametrize("raw, expected", [("", False), ("0", False), ("1", True), ("yes", True), ("off", False),
                                           ("sometimes", None)])
def test_per_head_switch(monkeypatch, raw, expected):
    monkeypatch.setenv("INFERA_NORM_PER_HEAD_KERNEL", raw)
    if expected is None:
        with pytest.raises(ValueError, match="INFERA_NORM_PER_HEAD_KERNEL"):
            policy.per_head_kernel()
    else:
        assert policy.per_head_kernel() is expected
