"""The skinny-M linear kernels compile for every GPU family, on any machine (infera_vllm.aot: Triton's lowering
and the backend's register allocation run ahead of time, no GPU needed), and what can be launched there fits:

- every Triton config of the family's shipped table (``tuning/<family>.json``) compiles without spilling and
  within the family's shared memory;
- the tuner's grid (tune.GRID) at its smallest tile for each token bucket fits every family; its largest tile
  fits none, and ``tune.fitting`` drops it before timing, so no table can hold it (``report_cases``: the
  largest tiles, which ``benchmarks/aot_resources.py --op linear-hipblaslt`` also tabulates);
- the split-K sum kernel fits.

``INFERA_AOT_FAMILY`` picks the families (the nox session of a family sets its own); unset: all of them.
"""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels: runs in the session without Triton's interpreter", allow_module_level=True)

from infera_ops.linear_hipblaslt import launch, policy, tune  # noqa: E402
from infera_ops.linear_hipblaslt.kernels import _skinny_linear_kernel, _split_k_sum_kernel  # noqa: E402
from infera_ops.linear_hipblaslt.launch import LaunchConfig
from infera_vllm import aot  # noqa: E402

pytestmark = pytest.mark.aot_compile

BUCKETS = (1, 32, 64)  # token counts whose candidates take BLOCK_M = 16, 32, 64 (tune._candidates)


def _launch(cfg: LaunchConfig) -> str:
    """BLOCK_M x BLOCK_N x BLOCK_K, the K split, warps, stages."""
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} split {cfg.split_k} w{cfg.num_warps} s{cfg.num_stages}"


def _grid_corner(m: int, largest: bool) -> LaunchConfig:
    """The tuner's smallest or largest candidate at m tokens (tile area, then stages, then K split)."""
    pick = max if largest else min
    return pick(tune._candidates(m), key=lambda c: (c.block_n * c.block_k, c.num_stages, c.split_k))


def _case(cfg: LaunchConfig, label: str, dtype: str = "bfloat16", bias: bool = False, **kw) -> aot.Case:
    return aot.Case(_skinny_linear_kernel, label, _launch(cfg), tune.compile_args(cfg, dtype, bias), **kw)


def compile_cases(family: str) -> list[aot.Case]:
    """The family's table configs, the grid's smallest tile per token bucket, the split-K sum."""
    found = policy.load(family)
    cases = [_case(b.config, f"table N={n} K={k} M<={b.max_m}", dtype, bias)
             for (n, k, dtype, bias), buckets in sorted((found.entries if found else {}).items())
             for b in buckets if b.config is not None]
    cases += [_case(_grid_corner(m, largest=False), f"grid M={m} smallest") for m in BUCKETS]
    cases.append(aot.Case(_split_k_sum_kernel, "split-K sum", f"BLOCK={launch.SUM_BLOCK} w4",
                          dict(pointers={"part_ptr": "*fp32", "bias_ptr": "*bf16", "y_ptr": "*bf16"},
                               constexprs=dict(HAS_BIAS=True, BLOCK=launch.SUM_BLOCK), divisible=("N",))))
    return cases


def report_cases(family: str) -> list[aot.Case]:
    """The grid's largest tile per token bucket: compiled for the resource table, never launched (they do not
    fit; the tuner drops them)."""
    return [_case(_grid_corner(m, largest=True), f"grid M={m} largest", must_fit=False) for m in BUCKETS]


@aot.parametrize(compile_cases)
def test_compiles_and_fits(family, case):
    aot.check(case, family)


@pytest.mark.parametrize("family", aot.selected_families())
def test_tuner_times_only_what_fits(family):
    """The grid's largest tile at 64 tokens (64 x 64 x 256 at 4 stages) needs more shared memory than any
    family gives a program, so the tuner never times it; the smallest fits everywhere."""
    small, large = _grid_corner(64, largest=False), _grid_corner(64, largest=True)
    assert tune.fitting([small, large], family) == [small]
