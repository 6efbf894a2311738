"""The RMSNorm kernel compiles for every GPU family, on any machine, at every launch configuration
launch.launch_config picks for common hidden sizes, with bf16 and fp32 (GemmaRMSNorm) weights, without
spilling (infera_vllm.aot: Triton's lowering and the backend's register allocation run ahead of time, no GPU
needed). Launches are not checked here.

``INFERA_AOT_FAMILY`` picks the families (the nox session of a family sets its own); unset: all of them.
``benchmarks/aot_resources.py --op norm`` prints what each case uses (docs/operators/norm.md).
"""

import os

import pytest

if os.environ.get("TRITON_INTERPRET") == "1":
    pytest.skip("compiles real kernels: runs in the session without Triton's interpreter", allow_module_level=True)

from infera_ops.norm.kernels import _rms_norm_fwd_kernel  # noqa: E402
from infera_ops.norm.launch import launch_config  # noqa: E402
from infera_vllm import aot  # noqa: E402

pytestmark = pytest.mark.aot_compile

POINTERS = {"x_ptr": "*bf16", "res_ptr": "*bf16", "res_out_ptr": "*bf16", "w_ptr": "*bf16", "y_ptr": "*bf16"}
GEMMA = {**POINTERS, "w_ptr": "*fp32"}  # GemmaRMSNorm's 1 + w, in fp32
# per-head q/k norms (Qwen3), SmolLM2-135M, Llama-3.2-1B, gpt-oss, Llama-3-8B, Qwen3-14B, DeepSeek-V3, Llama-3-70B
HIDDEN = (128, 576, 2048, 2880, 4096, 5120, 7168, 8192)
TOKENS = (1, 1024, 4096)  # launch_config's rules change at 1024 and 4096 tokens


def compile_cases(family: str) -> list[aot.Case]:
    """One case per distinct compiled kernel launch_config leads to over HIDDEN x TOKENS, plain and fused add
    (the hidden size itself is a runtime argument: 7168 and 8192 share a kernel). launch_config is the same
    on every family."""
    cases, seen = [], set()
    for pointers, weight in ((POINTERS, ""), (GEMMA, " fp32 weight")):
        for fused in (False, True):
            for H in HIDDEN:
                for M in TOKENS:
                    cfg = launch_config(M, H, fused)
                    key = (weight, fused, cfg.block_h, cfg.rows, cfg.num_warps, cfg.num_stages)
                    if key in seen:
                        continue
                    seen.add(key)
                    consts = dict(BLOCK_H=cfg.block_h, ROWS=cfg.rows, FUSED_ADD=fused, HAS_WEIGHT=True)
                    cases.append(aot.Case(_rms_norm_fwd_kernel,
                                          f"{'add+rms' if fused else 'rms'}{weight} H={H} M={M}",
                                          f"BLOCK_H={cfg.block_h} ROWS={cfg.rows} w{cfg.num_warps} s{cfg.num_stages}",
                                          dict(pointers=pointers, constexprs=consts, floats={"eps"},
                                               num_warps=cfg.num_warps, num_stages=cfg.num_stages)))
    return cases


@aot.parametrize(compile_cases)
def test_compiles_without_spills(family, case):
    aot.check(case, family)
