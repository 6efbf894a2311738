"""The kernels against the fp32 reference on fresh random inputs (never zeros), odd shapes included, outputs
poisoned; on the CPU under Triton's interpreter."""

import pytest
import torch

from infera_ops.REPLACE_ME_MODULE import launch
from infera_ops.REPLACE_ME_MODULE.reference import REPLACE_ME_reference

pytestmark = pytest.mark.interpret
# (dtype, atol, rtol): from the kernel's error bound (REPLACE_ME: e.g. one rounding of the output to the dtype)
DTYPES = [(torch.bfloat16, 8e-3, 8e-3), (torch.float16, 1e-3, 1e-3)]
SHAPES = [(1, 64), (3, 576), (5, 123), (17, 96)]  # odd sizes: masks and partial tiles


@pytest.mark.parametrize("M, H", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
def test_matches_the_reference(device, poisoned, M, H, dtype, atol, rtol):
    x = torch.randn(M, H, dtype=dtype, device=device) * 3 + 0.5
    got = launch.REPLACE_ME(x, out=poisoned((M, H), dtype, device))
    assert not torch.isnan(got).any(), "unwritten (poisoned) elements in the output"
    torch.testing.assert_close(got.float(), REPLACE_ME_reference(x), atol=atol, rtol=rtol)
