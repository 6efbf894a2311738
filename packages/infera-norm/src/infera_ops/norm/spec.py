"""What infera-norm declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import OpSpec, Symbol

_IR_PARAMS = ("provider", "supported", "supports_args")

SPEC = OpSpec(
    name="norm",
    distribution="infera-norm",
    seam="vLLM IR provider 'infera' for rms_norm and fused_add_rms_norm",
    summary="RMSNorm and fused add+RMSNorm (Triton, fp32 accumulation)",
    vllm=">=0.24,<0.33",  # vllm.ir appeared in 0.24; 0.26 and 0.32 are the releases we run
    requires=(
        Symbol("vllm.ir.ops", "rms_norm.register_impl", params=_IR_PARAMS),
        Symbol("vllm.ir.ops", "fused_add_rms_norm.register_impl", params=_IR_PARAMS),
        Symbol("vllm.config.kernel", "IrOpPriorityConfig"),
    ),
    gpu_families=("cpu", "sm80", "sm86", "sm89", "sm90", "sm100", "gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1201"),
    activate="infera_ops.norm.seam:activate",
    sites=("rms_norm",),
)
