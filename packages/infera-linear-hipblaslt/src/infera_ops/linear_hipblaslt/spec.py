"""What infera-linear-hipblaslt declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import GPU_FAMILIES, OpSpec, Switch, Symbol

SPEC = OpSpec(
    name="linear-hipblaslt",
    distribution="infera-linear-hipblaslt",
    seam="vllm.model_executor.layers.linear.dispatch_unquantized_gemm (wrapped before the model is built)",
    vllm=">=0.24,<0.33",
    requires=(
        Symbol("vllm.model_executor.layers.linear", "dispatch_unquantized_gemm"),
        Symbol("vllm.model_executor.layers.utils", "default_unquantized_gemm", params=("layer", "x", "weight", "bias")),
        Symbol("vllm.model_executor.layers.vocab_parallel_embedding", "dispatch_unquantized_gemm"),
        Symbol("vllm.model_executor.layers.linear", "UnquantizedLinearMethod.apply", params=("layer", "x", "bias")),
        # 0.32 chooses the GEMM once per layer at construction, from the kernel config's linear_backend.
        Symbol("vllm.model_executor.layers.utils", "dispatch_unquantized_gemm", params=("linear_backend",),
               vllm=">=0.32"),
    ),
    gpu_families=GPU_FAMILIES,
    default_on=False,  # opt-in: INFERA_VLLM_OPS=...,linear-hipblaslt
    activate="infera_ops.linear_hipblaslt.seam:activate",
    sites=("linear",),
    # fp32 accumulation, one bf16 rounding of the output, as vLLM's GEMM: they differ by at most two bf16
    # units of the output's largest element
    self_check_bound=1.6e-2,
    plan="infera_ops.linear_hipblaslt.seam:plan",
    tune="infera_ops.linear_hipblaslt.tune:main",
    switches=(
        Switch("INFERA_LINEAR_TUNING", "path", doc="tuning table replacing the family's tuning/<family>.json"),
        Switch("INFERA_LINEAR_EAGER", "flag", False,
               doc="tuned shapes' eager calls go to the kernel too (default: only calls captured in CUDA graphs)"),
    ),
)
