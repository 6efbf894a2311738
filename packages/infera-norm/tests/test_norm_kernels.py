"""The Triton kernels against the fp32 reference; on the CPU under Triton's interpreter."""

import importlib
import os

import pytest
import torch

from infera_ops.norm.reference import fused_add_rms_norm_reference, rms_norm_reference

# On the CPU the kernels run under Triton's interpreter, which must be on before triton is first imported
# (its own tl.* helpers are @jit functions): nox runs this marker in its own pytest with TRITON_INTERPRET=1.
pytestmark = pytest.mark.interpret
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 from interpreter start (nox sets it)",
                allow_module_level=True)
pytest.importorskip("triton")
launch = importlib.import_module("infera_ops.norm.launch")

# (dtype, atol, rtol) against an fp32 reference: one bf16/fp16 rounding of the output, plus the rounding
# of the normalised row to the weight dtype before the multiply.
DTYPES = [(torch.bfloat16, 2e-2, 2e-2), (torch.float16, 4e-3, 4e-3)]
SHAPES = [(1, 64), (3, 576), (5, 123), (7, 2048), (2, 5120), (1, 7168), (17, 96), (4, 1000)]


def _poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _assert_close(got, ref, atol, rtol):
    assert not torch.isnan(got).any(), "unwritten (poisoned) elements in the output"
    torch.testing.assert_close(got.float(), ref.float(), atol=atol, rtol=rtol)


@pytest.mark.parametrize("M, H", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_rms_norm(M, H, dtype, atol, rtol):
    x = torch.randn(M, H, dtype=dtype, device=DEVICE) * 3 + 0.5
    w = torch.randn(H, dtype=dtype, device=DEVICE)
    y = launch.rms_norm(x, w, 1e-6, out=_poisoned(x.shape, dtype))
    assert y.shape == x.shape and y.dtype == dtype
    _assert_close(y, rms_norm_reference(x, w, 1e-6), atol, rtol)


@pytest.mark.parametrize("M, H", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_fused_add_rms_norm(M, H, dtype, atol, rtol):
    x = torch.randn(M, H, dtype=dtype, device=DEVICE)
    r = torch.randn(M, H, dtype=dtype, device=DEVICE)
    w = torch.randn(H, dtype=dtype, device=DEVICE)
    y, h = launch.fused_add_rms_norm(x, r, w, 1e-5, out=_poisoned(x.shape, dtype),
                                     residual_out=_poisoned(x.shape, dtype))
    y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-5)
    _assert_close(h, h_ref, atol, rtol)
    _assert_close(y, y_ref, atol, rtol)


@pytest.mark.parametrize("M, H", [(3, 2304), (5, 123), (2, 2560)])
@pytest.mark.parametrize("fused", [False, True])
def test_fp32_weight_as_gemma_passes_it(M, H, fused):
    """GemmaRMSNorm passes ``1 + w`` in fp32: no rounding of the normalised row before the multiply (vLLM's
    native numerics for an fp32 weight), one rounding of the output to bf16."""
    x = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE) * 2
    r = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(H, device=DEVICE) * 0.3 + 1.0
    if fused:
        y, h = launch.fused_add_rms_norm(x, r, w, 1e-6, out=_poisoned(x.shape, torch.bfloat16),
                                         residual_out=_poisoned(x.shape, torch.bfloat16))
        y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
        _assert_close(h, h_ref, 1e-2, 1e-2)
    else:
        y, y_ref = launch.rms_norm(x, w, 1e-6, out=_poisoned(x.shape, torch.bfloat16)), rms_norm_reference(x, w, 1e-6)
    assert y.dtype == torch.bfloat16
    # one bf16 rounding only: within half a bf16 unit of the fp32 result (a rounding of the row first would
    # add another)
    _assert_close(y, y_ref, 1e-6, 2**-8)


def test_strided_view_and_leading_dims():
    # q and k of a fused qkv projection: views with row stride 3*H; and a [B, T, H] input
    qkv = torch.randn(6, 3 * 128, dtype=torch.bfloat16, device=DEVICE)
    q = qkv[:, :128]
    w = torch.randn(128, dtype=torch.bfloat16, device=DEVICE)
    _assert_close(launch.rms_norm(q, w, 1e-6, out=_poisoned(q.shape, q.dtype)), rms_norm_reference(q, w, 1e-6),
                  2e-2, 2e-2)
    x3 = torch.randn(2, 3, 576, dtype=torch.bfloat16, device=DEVICE)
    w3 = torch.randn(576, dtype=torch.bfloat16, device=DEVICE)
    _assert_close(launch.rms_norm(x3, w3, 1e-6), rms_norm_reference(x3, w3, 1e-6), 2e-2, 2e-2)


def test_without_weight():
    x = torch.randn(3, 200, dtype=torch.float16, device=DEVICE)
    _assert_close(launch.rms_norm(x, None, 1e-6), rms_norm_reference(x, None, 1e-6), 4e-3, 4e-3)


def test_non_unit_column_stride_is_refused():
    x = torch.randn(64, 4, dtype=torch.bfloat16, device=DEVICE).t()
    with pytest.raises(ValueError, match="contiguous"):
        launch.rms_norm(x, None, 1e-6)


@pytest.mark.parametrize("M, H", [(3, 576), (5, 2048), (1, 123)])
def test_fused_add_in_place(M, H):
    """vLLM's provider contract: the output overwrites x and the sum overwrites the residual."""
    x = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE)
    r = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(H, dtype=torch.bfloat16, device=DEVICE)
    y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
    y, h = launch.fused_add_rms_norm(x, r, w, 1e-6, out=x, residual_out=r)
    assert y.data_ptr() == x.data_ptr() and h.data_ptr() == r.data_ptr()
    _assert_close(x, y_ref, 2e-2, 2e-2)
    _assert_close(r, h_ref, 2e-2, 2e-2)


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("programs, rows, M, H", [(2, 2, 17, 576), (3, 1, 10, 2048), (1, 4, 9, 96)])
def test_persistent_launch_covers_every_row(fused, programs, rows, M, H):
    """Fewer programs than row blocks: each program loops; rows past M are masked, none skipped."""
    from infera_ops.norm.launch import LaunchConfig

    cfg = LaunchConfig(block_h=1 << (H - 1).bit_length(), rows=rows, num_warps=4, programs=programs, num_stages=2)
    x = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE)
    r = torch.randn(M, H, dtype=torch.bfloat16, device=DEVICE)
    w = torch.randn(H, dtype=torch.bfloat16, device=DEVICE)
    y, h = _poisoned(x.shape, x.dtype), _poisoned(x.shape, x.dtype)
    if fused:
        launch._launch(x, r, h, w, y, 1e-6, config=cfg)
        y_ref, h_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
        _assert_close(h, h_ref, 2e-2, 2e-2)
    else:
        launch._launch(x, None, None, w, y, 1e-6, config=cfg)
        y_ref = rms_norm_reference(x, w, 1e-6)
    _assert_close(y, y_ref, 2e-2, 2e-2)


@pytest.mark.skipif(DEVICE != "cuda", reason="CUDA graphs need a GPU (the sm90 session runs this)")
@pytest.mark.parametrize("M, H", [(1, 4096), (37, 576), (1024, 7168), (4096, 2048)])
def test_cuda_graph_capture_and_replay(M, H):
    """vLLM captures decode into CUDA graphs: the launch must be capturable (no host sync, no allocation
    it does not own) and a replay must read the inputs' current contents."""
    x, r = (torch.empty(M, H, dtype=torch.bfloat16, device=DEVICE) for _ in range(2))
    w = torch.randn(H, dtype=torch.bfloat16, device=DEVICE)
    y = torch.empty_like(x)
    x.normal_(), r.normal_()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up (compile) outside the capture, as vLLM does
        launch.rms_norm(x, w, 1e-6, out=y)
        launch.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch.rms_norm(x, w, 1e-6, out=y)
        launch.fused_add_rms_norm(x, r, w, 1e-6, out=x, residual_out=r)
    for _ in range(2):  # fresh inputs each replay
        x.copy_(torch.randn_like(x)), r.copy_(torch.randn_like(r))
        y.fill_(float("nan"))
        y_ref = rms_norm_reference(x, w, 1e-6)
        fy_ref, fh_ref = fused_add_rms_norm_reference(x, r, w, 1e-6)
        graph.replay()
        torch.cuda.synchronize()
        _assert_close(y, y_ref, 2e-2, 2e-2)
        _assert_close(x, fy_ref, 2e-2, 2e-2)
        _assert_close(r, fh_ref, 2e-2, 2e-2)
