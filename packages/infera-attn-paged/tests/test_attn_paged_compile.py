"""The kernels compile for the GPUs they serve, on any machine: Triton's frontend, its MLIR lowering and
ptxas run ahead of time for sm90 (Hopper), so an error that only the compiler sees (the interpreter runs
the kernels as Python) fails in CI before a GPU session is spent on it. Launches are not checked here."""

import inspect
import os

import pytest
import triton

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels: runs in the session without Triton's interpreter", allow_module_level=True)

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from infera_ops.attn_paged import ops  # noqa: E402
from infera_ops.attn_paged.kernels import _paged_decode_kernel, _paged_decode_reduce_kernel  # noqa: E402
from infera_ops.attn_paged.prefill_kernels import _paged_prefill_kernel  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
FLOATS = {"scale", "softcap"}
# everything else that is not a pointer or a constexpr is an int32 (sizes, strides, window)
POINTERS = {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "block_table_ptr": "*i32", "seq_lens_ptr": "*i32",
            "query_start_loc_ptr": "*i32", "sinks_ptr": "*fp32", "out_ptr": "*bf16", "part_out_ptr": "*fp32",
            "part_lse_ptr": "*fp32"}


def _compile(kernel, constexprs, num_warps=4, num_stages=2):
    names = list(inspect.signature(kernel.fn).parameters)
    signature = {n: "constexpr" if n in constexprs else POINTERS.get(n, "fp32" if n in FLOATS else "i32")
                 for n in names}
    # as Triton specialises them at launch: pointers and strides 16-aligned (vLLM's caches and activations
    # are), which is what lets the compiler vectorise and pipeline the loads
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names)
               if n not in constexprs and (n in POINTERS or n.endswith("_stride"))}
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=aligned),
                          target=SM90, options={"num_warps": num_warps, "num_stages": num_stages})


def _features(on):
    return dict(HAS_SINKS=on, HAS_SOFTCAP=on, HAS_WINDOW=on, FP32_DOT=False)


@pytest.mark.parametrize("D,G", [(128, 4), (64, 3), (256, 2), (80, 8)])
@pytest.mark.parametrize("split", [True, False])
def test_decode_compiles_for_sm90(D, G, split):
    cfg = ops.launch_config(D)
    consts = dict(G=G, BLOCK_G=max(16, triton.next_power_of_2(G)), D=D, BLOCK_D=triton.next_power_of_2(D), PAGE=16,
                  BLOCK_N=cfg.block_n, SPLIT=split, USE_PDL=split, **_features(split))
    assert _compile(_paged_decode_kernel, consts, cfg.num_warps, cfg.num_stages).asm["cubin"]


@pytest.mark.parametrize("features", [True, False])
def test_reduce_compiles_for_sm90(features):
    consts = dict(D=80, BLOCK_D=128, BLOCK_S=ops.MAX_SPLITS, HAS_SINKS=features, HAS_WINDOW=features,
                  USE_PDL=features)
    compiled = _compile(_paged_decode_reduce_kernel, consts)
    assert compiled.asm["cubin"]
    # the programmatic-dependent-launch wait is in the code where asked for, and only there
    assert ("griddepcontrol.wait" in compiled.asm["ptx"]) == features


@pytest.mark.parametrize("D,G", [(128, 4), (64, 3), (256, 2)])
@pytest.mark.parametrize("features", [True, False])
def test_prefill_compiles_for_sm90(D, G, features):
    block_m, cfg = ops.prefill_config(D, G)
    consts = dict(G=G, BLOCK_M=block_m, BLOCK_Q=block_m // G, D=D, BLOCK_D=triton.next_power_of_2(D), PAGE=16,
                  BLOCK_N=cfg.block_n, **_features(features))
    assert _compile(_paged_prefill_kernel, consts, cfg.num_warps, cfg.num_stages).asm["cubin"]
