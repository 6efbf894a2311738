"""What infera-moe-decode declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import GPU_FAMILIES, OpSpec, Switch, Symbol

FP8_SEAM = ">=0.26"  # the FP8 experts' seam (seam._install_fp8): read in 0.26's and 0.32's sources

SPEC = OpSpec(
    name="moe-decode",
    distribution="infera-moe-decode",
    seam="out-of-tree UnquantizedFusedMoEMethod whose experts subclass vLLM's (TritonExperts on GPUs); "
         "FP8 MoE methods' TritonExperts, through the FP8 oracle's backend_to_kernel_cls",
    vllm=">=0.24,<0.33",
    requires=(
        Symbol("vllm.model_executor.layers.fused_moe", "UnquantizedFusedMoEMethod.register_oot"),
        Symbol("vllm.model_executor.custom_op", "op_registry_oot"),
        Symbol("vllm.model_executor.layers.fused_moe.oracle.unquantized", "UnquantizedMoeBackend.TRITON"),
        Symbol("vllm.model_executor.layers.fused_moe.experts.triton_moe", "TritonExperts.apply",
               params=("output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
                       "expert_map", "apply_router_weight_on_input")),
        Symbol("vllm.model_executor.layers.fused_moe.experts.triton_moe", "TritonExperts.expects_unquantized_inputs",
               vllm=FP8_SEAM),
        Symbol("vllm.model_executor.layers.fused_moe.oracle.fp8", "backend_to_kernel_cls", params=("backend",),
               vllm=FP8_SEAM),
        Symbol("vllm.model_executor.layers.fused_moe.oracle.fp8", "Fp8MoeBackend.TRITON", vllm=FP8_SEAM),
    ),
    gpu_families=GPU_FAMILIES,
    activate="infera_ops.moe_decode.seam:activate",
    plan="infera_ops.moe_decode.seam:plan",
    sites=("moe",),
    self_check_bound=3e-2,  # bf16 output and activation roundings: 4e-3-8e-3 measured against vLLM on the H200
    switches=(
        Switch("INFERA_MOE_DECODE_TUNING", "path", doc="tuning file replacing the family's tuning/<family>.json"),
        Switch("INFERA_MOE_DECODE_MAX_TOKENS", "int", minimum=0,
               doc="serve every call of up to N tokens whatever the tuning file says (0: none); makes a family "
                   "without a tuning file usable"),
        Switch("INFERA_MOE_DECODE_CHECK_REFERENCE", "choice", "auto", choices=("auto", "vllm", "fp32"),
               doc="what the self-check compares the kernel with: vLLM's experts (vllm; they compile a kernel "
                   "per token count on first use on GPUs), the fp32 reference (fp32), or auto: vLLM's experts "
                   "on the CPU build, the fp32 reference on GPUs"),
    ),
)
