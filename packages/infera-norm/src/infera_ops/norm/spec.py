"""What infera-norm declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import GPU_FAMILIES, OpSpec, Switch, Symbol

_IR_PARAMS = ("provider", "supported", "supports_args")

SPEC = OpSpec(
    name="norm",
    distribution="infera-norm",
    seam="vLLM IR provider 'infera' for rms_norm and fused_add_rms_norm (first in the default priority "
         "when named in INFERA_VLLM_OPS; else select it with --ir-op-priority)",
    vllm=">=0.24,<0.33",  # vllm.ir appeared in 0.24; 0.26 and 0.32 are the releases we run
    requires=(
        Symbol("vllm.ir.ops", "rms_norm.register_impl", params=_IR_PARAMS),
        Symbol("vllm.ir.ops", "fused_add_rms_norm.register_impl", params=_IR_PARAMS),
        Symbol("vllm.config.kernel", "IrOpPriorityConfig"),
        Symbol("vllm.utils.torch_utils", "direct_register_custom_op",
               params=("op_name", "op_func", "mutates_args", "fake_impl", "target_lib", "dispatch_key")),
    ),
    gpu_families=GPU_FAMILIES,
    activate="infera_ops.norm.seam:activate",
    sites=("rms_norm",),
    self_check_bound=1.6e-2,  # two bf16 units at the output's largest element: fp32 statistics, one rounding each
    switches=(
        Switch("INFERA_NORM_EAGER_MIN_TOKENS", "int", minimum=0,
               doc="eager calls (no CUDA-graph capture) from this many tokens on go to the kernel (0: all); "
                   "unset: none, vLLM's next provider serves them (eager-launch-cost)"),
        Switch("INFERA_NORM_PER_HEAD_KERNEL", "flag", False,
               doc="per-head (q/k) norms stay on the kernel in compiled graphs too, instead of going to "
                   "vLLM's next provider for Inductor to fuse (per-head-fusion)"),
    ),
)
