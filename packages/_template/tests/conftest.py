"""Fixtures of this op's tests (REPLACE_ME_OP): where kernels run, and outputs that fail when left unwritten."""

import os

import pytest
import torch


@pytest.fixture
def device() -> str:
    """The GPU where there is one; else the CPU under Triton's interpreter (nox sets TRITON_INTERPRET=1 for the
    tests marked ``interpret``), else the test is skipped."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU kernel tests need TRITON_INTERPRET=1 from interpreter start (nox sets it)")
    return "cpu"


@pytest.fixture
def poisoned():
    """``poisoned(shape, dtype, device)``: an output filled with NaN, so an element the kernel never wrote fails."""
    return lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)
