"""The kernels compile for every GPU family they serve, on any machine, at the launch configurations the op
picks there, without spilling: Triton's frontend, its MLIR lowering and the backend's register allocation
(ptxas for sm90, LLVM's AMDGPU backend for the gfx families) run ahead of time (infera_vllm.aot), so an
error that only the compiler sees (the interpreter runs the kernels as Python) or a configuration that
spills fails in CI before a GPU session is spent on it. Launches are not checked here.

``INFERA_AOT_FAMILY`` picks the families (the nox session of a family sets its own); unset: all of them.
``benchmarks/aot_resources.py --op attn-paged`` prints what each case uses (docs/operators/attn-paged.md).
"""

import os
from unittest import mock

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels: runs in the session without Triton's interpreter", allow_module_level=True)

import torch  # noqa: E402
import triton  # noqa: E402

from infera_ops.attn_paged import launch, policy  # noqa: E402
from infera_ops.attn_paged.kernels import (  # noqa: E402
    _paged_decode_kernel,
    _paged_decode_reduce_kernel,
    _paged_prefill_kernel,  # noqa: E402
)
from infera_vllm import aot  # noqa: E402

pytestmark = pytest.mark.aot_compile

FLOATS = {"scale", "softcap"}
POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
            "query_start_loc_ptr": "*i32", "sinks_ptr": "*fp32", "out_ptr": "*bf16", "part_out_ptr": "*fp32",
            "part_lse_ptr": "*fp32", "count_ptr": "*i32"}
# (head size, query heads per KV head): SmolLM2-135M, a masked head size (80), Llama-3-8B, Gemma-2
HEADS = ((64, 3), (80, 8), (128, 4), (256, 2))
PAGE = 16  # vLLM's default KV-cache block size
# (family, case label) -> why a configuration the op launches spills; strict xfails: a fix turns them into failures
KNOWN_MISFITS = {}
if tuple(int(part) for part in triton.__version__.split(".")[:2]) >= (3, 9):
    KNOWN_MISFITS[("sm90", "prefill D=256 G=2 features")] = (
        "sm90 keeps its launch sizes: Triton 3.9's ptxas spills 4 bytes there (168 registers) with sinks, soft-cap "
        "and window on; Triton 3.6's, the H200's, none (194 registers; benchmarks/results/h200/aot/)")


# (head size, query heads per KV head) of the quantized-cache variants: the hd64 and hd128 tiles
QUANT_HEADS = ((64, 3), (128, 4))


def fp8_pointer(family: str) -> str:
    """The element type of an fp8 cache on the family, as vLLM's ``current_platform.fp8_dtype()`` types it:
    e4m3fnuz on gfx942 (MI300), OCP e4m3 elsewhere."""
    return "*fp8e4b8" if family == "gfx942" else "*fp8e4nv"


def quant_pointers(family: str, kv_quant: int) -> dict:
    """POINTERS with the caches quantized: fp8 per tensor (KV_QUANT 1), int8 per (token, head) (2), with
    their fp32 scales."""
    cache = fp8_pointer(family) if kv_quant == launch.KV_PER_TENSOR else "*i8"
    return dict(POINTERS, k_ptr=cache, v_ptr=cache, k_scale_ptr="*fp32", v_scale_ptr="*fp32")


# TRITON_ATTN's per-(token, head) layout (launch.kv_alignment): each K and V row carries its fp32 scale inline,
# so the value cache's base and the position strides are multiples of 4 bytes, not 16, as the launch finds them
PER_TOKEN_HEAD_UNALIGNED = ("v_ptr", "k_pos_stride", "v_pos_stride", "scale_pos_stride")


def quant_layout(kv_quant: int) -> dict:
    """The KV_ALIGN constexpr and the arguments Triton sees unaligned, as a launch over vLLM's caches of that
    KV_QUANT passes them."""
    if kv_quant == launch.KV_PER_TOKEN_HEAD:
        return dict(constexprs=dict(KV_ALIGN=4), unaligned=PER_TOKEN_HEAD_UNALIGNED)
    return dict(constexprs=dict(KV_ALIGN=16), unaligned=())


def _features(on):
    return dict(HAS_SINKS=on, HAS_SOFTCAP=on, HAS_WINDOW=on, FP32_DOT=False)


def _launch(cfg, **blocks) -> str:
    return " ".join([*(f"{k}={v}" for k, v in blocks.items()), f"w{cfg.num_warps}", f"s{cfg.num_stages}"])


def decode_config(family: str, head_size: int) -> launch.LaunchConfig:
    """The decode kernels' launch sizes on the family, as launch.decode_defaults picks them on its GPU (the
    family's tuning file, else launch.launch_config)."""
    with mock.patch.object(policy, "family_of", lambda device: family):
        return launch.decode_defaults(head_size, torch.device("cpu"))[0]


def prefill_config(family: str, head_size: int, group: int, kv_quant: int = launch.KV_PLAIN
                   ) -> tuple[int, launch.LaunchConfig]:
    """(BLOCK_M, launch sizes) of the prefill kernel on the family over a cache of that KV_QUANT, as
    launch.prefill_config picks them on its GPU (the family's tuning file, else the defaults)."""
    with mock.patch.object(policy, "family_of", lambda device: family):
        return launch.prefill_config(head_size, group, torch.device("cpu"), kv_quant)


def compile_cases(family: str) -> list[aot.Case]:
    """Every kernel of the op as it launches on the family: decode (one slice, features off; several slices,
    sinks + soft-cap + window on, merged by the reduce kernel or in the kernel), the split reduce at the
    largest slice count, prefill (features off, on),
    for each head size of HEADS. Programmatic dependent launch on CUDA only (the launcher never asks for it
    elsewhere: ``gdc_wait`` has no AMD lowering)."""
    cuda = aot.family(family).backend == "cuda"
    cases = []

    def case(kernel, label, launch, kv_quant=0, **args):
        # a head size the family's tuning file declines (every launch spills), or a quantized cache the policy
        # declines there: compiled and reported, not launched, so not required to fit
        served = declined is None and not (kv_quant and kv_quant in policy.QUANTIZED_KV_SPILLS.get(family, ()))
        cases.append(aot.Case(kernel, label, launch, args, must_fit=served,
                              known_misfit=KNOWN_MISFITS.get((family, label))))

    for D, G in HEADS:
        declined = policy.declined_head_size(D, family)
        BLOCK_D = triton.next_power_of_2(D)
        cfg = decode_config(family, D)
        for split, merge in ((False, False), (True, False), (True, True)):
            c = cfg.for_slices(2 if split else 1, G)  # a slice cap of 1 takes the group's unsplit sizes where set
            gm = triton.next_power_of_2(G)
            consts = dict(G=G, BLOCK_G=max(16, gm), D=D, BLOCK_D=BLOCK_D, PAGE=PAGE,
                          BLOCK_N=c.block_n, SPLIT=split, USE_PDL=split and cuda and not merge, MERGE=merge,
                          BLOCK_GM=gm, BLOCK_S=launch.merge_step(gm, BLOCK_D, launch.MAX_SPLITS),
                          KV_QUANT=launch.KV_PLAIN, KV_ALIGN=16, **_features(split))
            what = ("split, merged in the kernel" if merge else "split") if split else "one slice"
            case(_paged_decode_kernel, f"decode D={D} G={G} {what}",
                 _launch(c, BLOCK_N=c.block_n), pointers=POINTERS, constexprs=consts, floats=FLOATS,
                 num_warps=c.num_warps, num_stages=c.num_stages)
            if (D, G) in QUANT_HEADS and not merge:
                for kv_quant, kind in ((launch.KV_PER_TENSOR, "fp8"), (launch.KV_PER_TOKEN_HEAD, "int8/token")):
                    layout = quant_layout(kv_quant)
                    case(_paged_decode_kernel, f"decode D={D} G={G} {what} {kind}",
                         _launch(c, BLOCK_N=c.block_n), kv_quant, pointers=quant_pointers(family, kv_quant),
                         constexprs=dict(consts, KV_QUANT=kv_quant, **layout["constexprs"]),
                         unaligned=layout["unaligned"], floats=FLOATS, num_warps=c.num_warps,
                         num_stages=c.num_stages)
        consts = dict(D=D, BLOCK_D=BLOCK_D, BLOCK_S=launch.REDUCE_BLOCK_S, HAS_SINKS=True, HAS_WINDOW=True,
                      USE_PDL=cuda)
        case(_paged_decode_reduce_kernel, f"reduce D={D} BLOCK_S={launch.REDUCE_BLOCK_S}", f"w{cfg.reduce_warps}",
             pointers=POINTERS, constexprs=consts, num_warps=cfg.reduce_warps)
        block_m, pcfg = prefill_config(family, D, G)
        for on in (False, True):
            consts = launch.prefill_constexprs(G, D, PAGE, block_m, pcfg, sinks=on, softcap=on, window=on, cuda=cuda)
            case(_paged_prefill_kernel, f"prefill D={D} G={G} {'features' if on else 'plain'}",
                 _launch(pcfg, BLOCK_M=block_m, BLOCK_N=pcfg.block_n), pointers=POINTERS, constexprs=consts,
                 floats=FLOATS, num_warps=pcfg.num_warps, num_stages=pcfg.num_stages)
            if (D, G) in QUANT_HEADS and not on:
                for kv_quant, kind in ((launch.KV_PER_TENSOR, "fp8"), (launch.KV_PER_TOKEN_HEAD, "int8/token")):
                    layout = quant_layout(kv_quant)
                    qm, qcfg = prefill_config(family, D, G, kv_quant)
                    qconsts = launch.prefill_constexprs(G, D, PAGE, qm, qcfg, cuda=cuda, kv_quant=kv_quant,
                                                        kv_align=layout["constexprs"]["KV_ALIGN"])
                    case(_paged_prefill_kernel, f"prefill D={D} G={G} plain {kind}",
                         _launch(qcfg, BLOCK_M=qm, BLOCK_N=qcfg.block_n), kv_quant,
                         pointers=quant_pointers(family, kv_quant), constexprs=qconsts,
                         unaligned=layout["unaligned"], floats=FLOATS, num_warps=qcfg.num_warps,
                         num_stages=qcfg.num_stages)
    return cases


@aot.parametrize(compile_cases)
def test_compiles_without_spills(family, case):
    aot.check(case, family)


@pytest.mark.skipif("sm90" not in aot.selected_families(), reason="programmatic dependent launch is sm90's")
@pytest.mark.parametrize("pdl", [True, False])
def test_reduce_waits_for_the_main_kernel_only_under_pdl(pdl):
    consts = dict(D=80, BLOCK_D=128, BLOCK_S=launch.REDUCE_BLOCK_S, HAS_SINKS=pdl, HAS_WINDOW=pdl, USE_PDL=pdl)
    compiled = aot.compile_kernel(_paged_decode_reduce_kernel, "sm90", pointers=POINTERS, constexprs=consts)
    # the programmatic-dependent-launch wait is in the code where asked for, and only there
    assert ("griddepcontrol.wait" in compiled.asm["ptx"]) == pdl


@pytest.mark.skipif("sm90" not in aot.selected_families(), reason="programmatic dependent launch is sm90's")
@pytest.mark.parametrize("pdl", [True, False])
def test_main_kernel_releases_the_reduce_before_its_first_load_only_under_pdl(pdl):
    cfg = decode_config("sm90", 128)
    consts = dict(G=4, BLOCK_G=16, D=128, BLOCK_D=128, PAGE=PAGE, BLOCK_N=cfg.block_n, SPLIT=True, USE_PDL=pdl,
                  MERGE=False, BLOCK_GM=4, BLOCK_S=1, KV_QUANT=launch.KV_PLAIN, KV_ALIGN=16, **_features(False))
    compiled = aot.compile_kernel(_paged_decode_kernel, "sm90", pointers=POINTERS, constexprs=consts, floats=FLOATS,
                                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    ptx = compiled.asm["ptx"]
    # the release comes first, so the reduce grid is resident while this one streams; no release without PDL
    assert ("griddepcontrol.launch_dependents" in ptx) == pdl
    if pdl:
        assert ptx.index("griddepcontrol.launch_dependents") < ptx.index("ld.global")


@pytest.mark.skipif("sm90" not in aot.selected_families(), reason="the register cap (maxnreg) is NVIDIA's")
@pytest.mark.parametrize("D,G", [(128, 4), (64, 8)])
def test_merge_register_cap_keeps_the_tuned_programs_per_sm(D, G):
    """The merging kernel compiled as launch.paged_decode launches it under ``merge_max_registers`` =
    ``register_budget(programs_per_sm, num_warps)`` of the sm90 file takes at most that many registers, so
    as many programs fit an SM as the split policy counts on, with at most a few words spilled. Without the
    cap the hd128 merge takes more (138 against 112 without the merge under Triton 3.6, 3 programs per SM
    instead of 4): what the cap is for."""
    with mock.patch.object(policy, "family_of", lambda device: "sm90"):
        cfg, pol, _ = launch.decode_defaults(D, torch.device("cpu"))
    budget = launch.register_budget(pol.programs_per_sm, cfg.num_warps)
    assert pol.merge_max_registers in (0, budget)  # where the file caps the merge, it is the launch checked here
    consts = dict(G=G, BLOCK_G=16, D=D, BLOCK_D=D, PAGE=PAGE, BLOCK_N=cfg.block_n, SPLIT=True, USE_PDL=False,
                  MERGE=True, BLOCK_GM=triton.next_power_of_2(G), BLOCK_S=launch.merge_step(
                      triton.next_power_of_2(G), D, 8), KV_QUANT=launch.KV_PLAIN, KV_ALIGN=16, **_features(False))
    compiled = aot.compile_kernel(_paged_decode_kernel, "sm90", pointers=POINTERS, constexprs=consts, floats=FLOATS,
                                  num_warps=cfg.num_warps, num_stages=cfg.num_stages, maxnreg=budget)
    used = aot.resources(compiled)
    # a handful of words spilled (8 bytes at hd128 under Triton 3.6, the H200's; 72 under 3.9): whether that
    # pays is measured (bench_attn_paged.py --merge-max-registers, the tuner's pass 4), not assumed here
    assert used.registers <= budget and used.scratch_bytes <= 128, used
    assert used.occupancy * 4 >= pol.programs_per_sm * cfg.num_warps, used  # warps per scheduler, 4 schedulers


@pytest.mark.skipif("sm90" not in aot.selected_families(), reason="INFERA_AOT_FAMILY leaves sm90 out")
def test_per_token_head_rows_load_four_bytes_at_a_time():
    """A per-(token, head) cache's rows are 4-byte aligned only (their scales sit inline): told so, the decode
    kernel loads them a word at a time; unhinted it would load each element alone."""
    D, G = 128, 4
    consts = dict(G=G, BLOCK_G=16, D=D, BLOCK_D=D, PAGE=PAGE, BLOCK_N=64, SPLIT=False, USE_PDL=False, MERGE=False,
                  BLOCK_GM=4, BLOCK_S=1, KV_QUANT=launch.KV_PER_TOKEN_HEAD, **_features(False))
    layout = quant_layout(launch.KV_PER_TOKEN_HEAD)
    ptx = aot.compile_kernel(_paged_decode_kernel, "sm90", pointers=quant_pointers("sm90", launch.KV_PER_TOKEN_HEAD),
                             constexprs=dict(consts, **layout["constexprs"]), unaligned=layout["unaligned"],
                             floats=FLOATS).asm["ptx"]
    assert "ld.global.b8" not in ptx and "ld.global.u8" not in ptx
