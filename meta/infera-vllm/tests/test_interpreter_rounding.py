"""Under Triton's interpreter, fp32 -> bf16 conversions round to nearest even as on GPUs and in torch
(infera_vllm.triton_dot.round_bf16_like_gpus; the repository's conftest and the plugin apply it): bit for bit,
specials included, for an explicit cast and for the implicit cast of a store."""

import os

import pytest
import torch

pytestmark = pytest.mark.interpret
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("the interpreter's conversions: TRITON_INTERPRET=1 (nox sets it)", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from infera_vllm import triton_dot  # noqa: E402


@triton.jit
def _convert(x_ptr, cast_ptr, stored_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + i, mask=i < n)
    tl.store(cast_ptr + i, x.to(tl.bfloat16), mask=i < n)
    tl.store(stored_ptr + i, x, mask=i < n)  # converted by the store


def test_bf16_conversion_rounds_like_torch():
    assert triton_dot.round_bf16_like_gpus() and triton_dot.round_bf16_like_gpus()  # idempotent
    g = torch.Generator().manual_seed(0)
    specials = torch.tensor([float("nan"), float("inf"), -float("inf"), 3.3895e38, 0.0, -0.0, 1e-40, 1.00390625])
    x = torch.cat([torch.randn(4000, generator=g), specials])
    cast, stored = (torch.empty(x.numel(), dtype=torch.bfloat16) for _ in range(2))
    _convert[(1,)](x, cast, stored, x.numel(), BLOCK=4096)
    ref = x.to(torch.bfloat16)
    truncated = (x.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert (ref != truncated).float().mean() > 0.4  # the data tells rounding from truncation
    for out in (cast, stored):
        same = (out.view(torch.int16) == ref.view(torch.int16)) | (out.isnan() & ref.isnan())
        assert bool(same.all()), x[~same][:8]
