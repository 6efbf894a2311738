"""The decode experts kernels compile for every GPU family, on any machine, at the launches the op would use
there, without spilling (infera_vllm.aot: Triton's lowering and the backend's register allocation run ahead
of time, no GPU needed). Launches are not checked here.

Launches: each entry of the family's packaged tuning file (sm90; ``by_tokens`` and ``by_shape``), else the
family's defaults (``policy.default_config``, in every form: what ``INFERA_MOE_DECODE_MAX_TOKENS`` serves on
a family without a file); the persistent, split_sum and stream forms and the split form with ``early_down``
at the defaults too where the file has no such entry. ``INFERA_AOT_FAMILY`` picks the families (the nox session of a
family sets its own); unset: all of them.
"""

import json
import os
from importlib import resources

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels: runs in the session without Triton's interpreter", allow_module_level=True)

import triton  # noqa: E402

from infera_ops.moe_decode import launch, policy  # noqa: E402
from infera_ops.moe_decode.kernels import (  # noqa: E402
    _moe_down_kernel,
    _moe_down_sum_kernel,
    _moe_fused_kernel,
    _moe_gate_up_kernel,
    _moe_persistent_kernel,
    _moe_stream_kernel,
    _row_sum_kernel,
)
from infera_ops.moe_decode.launch import FORMS, LaunchConfig, block_m, block_mk  # noqa: E402
from infera_vllm import aot  # noqa: E402

pytestmark = pytest.mark.aot_compile

POINTERS = {"x_ptr": "*bf16", "w13_ptr": "*bf16", "w2_ptr": "*bf16", "topk_ids_ptr": "*i32",
            "topk_weights_ptr": "*fp32", "part_ptr": "*fp32", "act_ptr": "*bf16", "y_ptr": "*fp32",
            "rows_ptr": "*fp32", "out_ptr": "*bf16", "sync_ptr": "*i32", "count_ptr": "*i32",
            "s13_ptr": "*fp32", "s2_ptr": "*fp32"}
DIVISIBLE = {"H", "I", "COLS"}  # hidden and expert sizes and gate/up columns per program: multiples of 16
TOKENS = 16  # the largest decode call the op serves: BLOCK_M 16, BLOCK_MK 128 (top-8)


def _launches(family: str) -> list[tuple[str, LaunchConfig]]:
    packaged = resources.files("infera_ops.moe_decode").joinpath("tuning", f"{family}.json")
    if packaged.is_file():
        doc = json.loads(packaged.read_text())
        launches = [(f"M<={bound}", LaunchConfig(**cfg)) for bound, cfg in sorted(doc["by_tokens"].items(),
                                                                                   key=lambda kv: int(kv[0]))]
        launches += [(f"{shape} M<={bound}", LaunchConfig(**cfg)) for shape, entries in doc.get("by_shape", {}).items()
                     for bound, cfg in entries.items()]
        for form in ("persistent", "split_sum", "stream"):
            if all(cfg.form != form for _, cfg in launches):
                launches.append((f"defaults {form}", policy.default_config(family, form)))
        if all(not cfg.early_down for _, cfg in launches):
            early = policy.default_config(family, "split")
            early.early_down = True
            launches.append(("defaults early-down", early))
        return launches
    return [(f"defaults {form}", policy.default_config(family, form)) for form in FORMS]


# (family, case label) -> why a configuration the op launches spills; strict xfails: a fix turns them into failures
KNOWN_MISFITS = {}
if tuple(int(part) for part in triton.__version__.split(".")[:2]) < (3, 9):
    for _label in ("persistent M<=4", "persistent M<=8"):
        KNOWN_MISFITS[("sm90", _label)] = (
            "the persistent form at BLOCK_I=32, 4 stages (the H200's tuned launch at M = 4 and 8): Triton 3.6's "
            "ptxas, the H200's, puts 16 bytes per lane in local memory; Triton 3.9's none. Measured on the H200 "
            "with it (benchmarks/results/h200/moe-decode/)")


def compile_cases(family: str) -> list[aot.Case]:
    pdl_family = family.startswith("sm")
    cases = []
    for label, cfg in _launches(family):
        pdl = cfg.pdl and pdl_family
        common = dict(pointers=POINTERS, divisible=DIVISIBLE, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        tiles = dict(BLOCK_MK=block_mk(TOKENS * 8), BLOCK_M=block_m(TOKENS), FP32_DOT=False)
        settings = f"{cfg.form} BLOCK_I={cfg.block_i} w{cfg.num_warps} s{cfg.num_stages}{' pdl' if pdl else ''}"
        if cfg.form == "fused":
            cases.append(aot.Case(_moe_fused_kernel, f"fused {label}", settings, dict(common, constexprs=dict(
                tiles, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, USE_PDL=pdl)),
                known_misfit=KNOWN_MISFITS.get((family, f"fused {label}"))))
        elif cfg.form == "persistent":
            cases.append(aot.Case(_moe_persistent_kernel, f"persistent {label}", settings + f" BLOCK_N={cfg.block_n} "
                                  f"BLOCK_K={cfg.block_k}", dict(common, constexprs=dict(
                                      tiles, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
                                      BLOCK_K=cfg.block_k, USE_PDL=pdl)),
                                  known_misfit=KNOWN_MISFITS.get((family, f"persistent {label}"))))
        elif cfg.form == "stream":
            prefetch = cfg.prefetch_down and pdl_family
            cases.append(aot.Case(_moe_stream_kernel, f"stream {label}", settings + f" BLOCK_H={cfg.block_h} "
                                  f"BLOCK_N={cfg.block_n} BLOCK_K={cfg.block_k}" + (" prefetch" if prefetch else ""),
                                  dict(common, constexprs=dict(
                                      BLOCK_MK=tiles["BLOCK_MK"], BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h,
                                      BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, FP32_DOT=False, PREFETCH_DOWN=prefetch,
                                      PREFETCH_BLOCK=launch.PREFETCH_BLOCK)),
                                  known_misfit=KNOWN_MISFITS.get((family, f"stream {label}"))))
            continue  # the kernel writes the sums: no row-sum launch
        elif cfg.form == "split_sum":
            cases.append(aot.Case(_moe_gate_up_kernel, f"gate/up {label}", settings, dict(common, constexprs=dict(
                tiles, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, PREFETCH_DOWN=False,
                PREFETCH_BLOCK=launch.PREFETCH_BLOCK, USE_PDL=pdl, EARLY_DOWN=False, W_SCALED=False)),
                known_misfit=KNOWN_MISFITS.get((family, f"gate/up {label}"))))
            # the launch's own share count, and the in-kernel merge at 4 shares (the tuner's sweep has it)
            for split_i in sorted({cfg.split_i, 4}):
                cases.append(aot.Case(_moe_down_sum_kernel, f"down-sum {label}" + (f" {split_i} shares" if
                                                                                   split_i > 1 else ""),
                                      f"BLOCK_N={cfg.block_n} BLOCK_K={cfg.block_k} SPLIT_I={split_i} "
                                      f"w{cfg.num_warps} s{cfg.num_stages}",
                                      dict(common, constexprs=dict(BLOCK_T=8, BLOCK_N=cfg.block_n,
                                                                   BLOCK_K=cfg.block_k, SPLIT_I=split_i,
                                                                   FP32_DOT=False, USE_PDL=pdl,
                                                                   W_SCALED=False))))
            continue  # the down kernel writes the sums: no row-sum launch
        else:
            prefetch = cfg.prefetch_down and pdl_family
            early = cfg.early_down and pdl_family
            pdl = pdl or early
            cases.append(aot.Case(_moe_gate_up_kernel, f"gate/up {label}", settings + (" early-down" if early else ""),
                                  dict(common, constexprs=dict(
                                      tiles, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, PREFETCH_DOWN=prefetch,
                                      PREFETCH_BLOCK=launch.PREFETCH_BLOCK, USE_PDL=pdl, EARLY_DOWN=early,
                                      W_SCALED=False))))
            cases.append(aot.Case(_moe_down_kernel, f"down {label}", f"BLOCK_N={cfg.block_n} BLOCK_K={cfg.block_k} "
                                  f"w{cfg.num_warps} s{cfg.num_stages}" + (" early-down" if early else ""),
                                  dict(common, constexprs=dict(tiles, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                                                               USE_PDL=pdl, EARLY_DOWN=early, W_SCALED=False))))
        cases.append(aot.Case(_row_sum_kernel, f"row sum {label}", f"BLOCK_R={launch.SUM_BLOCK_R} "
                              f"BLOCK_N={launch.SUM_BLOCK_N}", dict(pointers=POINTERS, divisible=DIVISIBLE,
                                                                    constexprs=dict(BLOCK_R=launch.SUM_BLOCK_R,
                                                                                    BLOCK_N=launch.SUM_BLOCK_N,
                                                                                    USE_PDL=pdl))))
    return cases + fp8_cases(family)


def fp8_dtype(family: str) -> str:
    """The family's FP8 weights (``current_platform.fp8_dtype()``): e4m3fnuz on gfx942, e4m3fn elsewhere."""
    return "*fp8e4b8" if family == "gfx942" else "*fp8e4nv"


def fp8_cases(family: str) -> list[aot.Case]:
    """The FP8 experts' launches (W_SCALED): the family's FP8 launches (policy.fp8_launches), both kernels of
    each."""
    pointers = dict(POINTERS, w13_ptr=fp8_dtype(family), w2_ptr=fp8_dtype(family))
    cases = []
    for label, cfg in policy.fp8_launches(family):
        common = dict(pointers=pointers, divisible=DIVISIBLE, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        tiles = dict(BLOCK_MK=block_mk(TOKENS * 8), BLOCK_M=block_m(TOKENS), FP32_DOT=False)
        settings = f"{cfg.form} BLOCK_I={cfg.block_i} BLOCK_H={cfg.block_h} w{cfg.num_warps} s{cfg.num_stages}"
        cases.append(aot.Case(_moe_gate_up_kernel, f"fp8 gate/up {label}", settings, dict(common, constexprs=dict(
            tiles, BLOCK_I=cfg.block_i, BLOCK_H=cfg.block_h, PREFETCH_DOWN=False, PREFETCH_BLOCK=launch.PREFETCH_BLOCK,
            USE_PDL=False, EARLY_DOWN=False, W_SCALED=True))))
        down = f"BLOCK_N={cfg.block_n} BLOCK_K={cfg.block_k} w{cfg.num_warps} s{cfg.num_stages}"
        if cfg.form == "split_sum":
            cases.append(aot.Case(_moe_down_sum_kernel, f"fp8 down-sum {label}", down, dict(common, constexprs=dict(
                BLOCK_T=8, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_I=cfg.split_i, FP32_DOT=False,
                USE_PDL=False, W_SCALED=True))))
        else:
            cases.append(aot.Case(_moe_down_kernel, f"fp8 down {label}", down, dict(common, constexprs=dict(
                tiles, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_PDL=False, EARLY_DOWN=False, W_SCALED=True))))
    return cases


@aot.parametrize(compile_cases)
def test_compiles_without_spills(family, case):
    aot.check(case, family)
