"""The skinny-M linear kernel against the fp32 reference; on the CPU under Triton's interpreter."""

import importlib
import os

import pytest
import torch

from infera_ops.linear_hipblaslt.reference import linear_reference

pytestmark = pytest.mark.interpret
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 from interpreter start (nox sets it)",
                allow_module_level=True)
pytest.importorskip("triton")
launch = importlib.import_module("infera_ops.linear_hipblaslt.launch")
kernels = importlib.import_module("infera_ops.linear_hipblaslt.kernels")


def _check(out, ref, dtype):
    assert not torch.isnan(out).any(), "unwritten (poisoned) elements in the output"
    tol = 2e-2 if dtype == torch.bfloat16 else 4e-3  # one rounding of the output
    torch.testing.assert_close(out.float(), ref, atol=tol * ref.abs().max().item(), rtol=tol)


@pytest.mark.parametrize("M, N, K", [(1, 48, 64), (3, 100, 72), (16, 33, 130), (17, 64, 96), (40, 80, 200)])
@pytest.mark.parametrize("split_k", [1, 3])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_skinny_linear(M, N, K, split_k, bias, dtype):
    """Odd N and K (ragged last blocks), M across block_m, split K (partials + ordered sum), bias."""
    gen = torch.Generator().manual_seed(M * 7919 + N * 31 + K)
    x = torch.randn(M, K, generator=gen).to(DEVICE, dtype)
    w = (torch.randn(N, K, generator=gen) / K**0.5).to(DEVICE, dtype)
    b = torch.randn(N, generator=gen).to(DEVICE, dtype) if bias else None
    out = torch.full((M, N), float("nan"), dtype=dtype, device=DEVICE)
    cfg = launch.LaunchConfig(block_m=16, block_n=16, block_k=32, split_k=split_k)
    got = launch.skinny_linear(x, w, b, cfg, out=out)
    assert got.data_ptr() == out.data_ptr()
    _check(got, linear_reference(x, w, b), dtype)


def test_leading_dims_and_strided_rows():
    """[B, T, K] input whose rows are a slice of a wider buffer (row stride != K), like vLLM's views."""
    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(2, 3, 100, generator=gen).to(DEVICE, torch.bfloat16)
    x = wide[..., 10:74]
    w = (torch.randn(40, 64, generator=gen) / 8).to(DEVICE, torch.bfloat16)
    got = launch.skinny_linear(x, w, None, launch.LaunchConfig(block_n=32, block_k=32))
    assert got.shape == (2, 3, 40)
    _check(got, linear_reference(x.reshape(-1, 64), w, None).view(2, 3, 40), torch.bfloat16)


def test_bad_layout_and_blocks_are_refused():
    x = torch.randn(2, 64, device=DEVICE, dtype=torch.bfloat16)
    w = torch.randn(64, 32, device=DEVICE, dtype=torch.bfloat16).t()  # [32, 64] with stride (1, 32)
    with pytest.raises(ValueError, match="unit stride"):
        launch.skinny_linear(x, w, None, launch.LaunchConfig())
    with pytest.raises(ValueError, match=">= 16"):
        launch.LaunchConfig(block_n=8)


def test_every_shipped_table_config_is_correct(monkeypatch):
    """Each triton bucket of each packaged table gives the right answer at its shape and token bound."""
    from importlib import resources

    policy = importlib.import_module("infera_ops.linear_hipblaslt.policy")
    monkeypatch.delenv("INFERA_LINEAR_TUNING", raising=False)
    files = [p.name[:-5] for p in resources.files("infera_ops.linear_hipblaslt").joinpath("tuning").iterdir()
             if p.name.endswith(".json")]
    assert "cpu" in files
    for family in files:
        loaded = policy.load(family)
        for (n, k, dtype, bias), buckets in loaded.entries.items():
            if n * k > 1 << 22 and DEVICE == "cpu":
                continue  # a GPU family's real shapes: too slow for the interpreter, run in the GPU session
            for bucket in buckets:
                if bucket.choice != "triton":
                    continue
                dt = getattr(torch, dtype)
                x = torch.randn(bucket.max_m, k, device=DEVICE).to(dt)
                w = (torch.randn(n, k, device=DEVICE) / k**0.5).to(dt)
                _check(launch.skinny_linear(x, w, None, bucket.config), linear_reference(x, w, None), dt)
