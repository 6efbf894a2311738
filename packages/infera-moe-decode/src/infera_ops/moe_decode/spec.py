"""What infera-moe-decode declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import OpSpec, Symbol

SPEC = OpSpec(
    name="moe-decode",
    distribution="infera-moe-decode",
    seam="out-of-tree UnquantizedFusedMoEMethod whose experts subclass TritonExperts",
    summary="SwiGLU experts for M <= 16 tokens (Triton GEMV, fused router weight and top-k reduction)",
    vllm=">=0.24,<0.33",
    requires=(
        Symbol("vllm.model_executor.layers.fused_moe", "UnquantizedFusedMoEMethod.register_oot"),
        Symbol("vllm.model_executor.layers.fused_moe.oracle.unquantized", "UnquantizedMoeBackend.TRITON"),
        Symbol("vllm.model_executor.layers.fused_moe.experts.triton_moe", "TritonExperts.apply",
               params=("output", "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "activation",
                       "expert_map", "apply_router_weight_on_input")),
    ),
    gpu_families=("cpu", "sm80", "sm86", "sm89", "sm90", "sm100", "gfx942", "gfx950", "gfx1100", "gfx1151", "gfx1201"),
    activate="infera_ops.moe_decode.seam:activate",
    sites=("moe",),
)
