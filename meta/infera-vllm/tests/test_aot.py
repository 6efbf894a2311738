"""infera_vllm.aot: family selection (any session) and, marked aot_compile, what it reads from code compiled
for each family: a small kernel fits, a kernel holding a huge tile per thread is reported as spilling."""

import os

import pytest

from infera_vllm import aot
from infera_vllm.testing import modules_imported_by


def test_import_light():
    assert not modules_imported_by("infera_vllm.aot") & {"torch", "triton", "vllm"}


def test_selected_families(monkeypatch):
    monkeypatch.delenv(aot.ENV_VAR, raising=False)
    assert aot.selected_families() == list(aot.FAMILIES)
    monkeypatch.setenv(aot.ENV_VAR, "gfx942, sm90")
    assert aot.selected_families() == ["gfx942", "sm90"]
    monkeypatch.setenv(aot.ENV_VAR, "all")
    assert aot.selected_families() == list(aot.FAMILIES)
    monkeypatch.setenv(aot.ENV_VAR, "gfx942,gfx9999")
    with pytest.raises(ValueError, match="gfx9999 not one of sm90, gfx942"):
        aot.selected_families()


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _scale_kernel(x_ptr, y_ptr, n, scale, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * scale, mask=offs < n)

    @triton.jit
    def _huge_tile_kernel(x_ptr, y_ptr, x_row_stride, ROWS: tl.constexpr, COLS: tl.constexpr):
        """Holds a [ROWS, COLS] fp32 tile and its exp across a loop: far more values per lane than registers."""
        r, c = tl.arange(0, ROWS), tl.arange(0, COLS)
        tile = tl.load(x_ptr + r[:, None] * x_row_stride + c[None, :])
        acc = tl.zeros([ROWS, COLS], tl.float32)
        for i in range(4):
            acc += tl.exp(tile * i) * tile
        tl.store(y_ptr + r[:, None] * x_row_stride + c[None, :], acc)

    return _scale_kernel, _huge_tile_kernel


@pytest.mark.aot_compile
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles real kernels")
@pytest.mark.parametrize("family", aot.selected_families())
def test_resources_of_a_small_and_a_spilling_kernel(family):
    scale, huge = _kernels()
    small = aot.compile_resources(scale, family, pointers={"x_ptr": "*fp32", "y_ptr": "*fp32"},
                                  constexprs={"BLOCK": 1024}, floats={"scale"})
    assert small.family == family and small.kernel == "_scale_kernel" and small.num_warps == 4
    assert 0 < small.registers < 64 and small.problems() == [] and small.occupancy >= 1
    assert (small.sgprs is None) == (aot.family(family).backend == "cuda")
    spilled = aot.compile_resources(huge, family, pointers={"x_ptr": "*fp32", "y_ptr": "*fp32"},
                                    constexprs={"ROWS": 64, "COLS": 128}, num_warps=1, num_stages=1)
    assert spilled.spills > 0 and spilled.scratch_bytes > 0, spilled
    assert any("scratch" in p for p in spilled.problems())
    with pytest.raises(AssertionError, match=f"_huge_tile_kernel on {family}: .*scratch"):
        aot.assert_fits(spilled)


@pytest.mark.aot_compile
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1", reason="compiles real kernels")
def test_every_constexpr_needs_a_value():
    scale, _ = _kernels()
    with pytest.raises(ValueError, match="no value for the constexprs BLOCK"):
        aot.compile_kernel(scale, "gfx942", pointers={"x_ptr": "*fp32", "y_ptr": "*fp32"}, constexprs={})
