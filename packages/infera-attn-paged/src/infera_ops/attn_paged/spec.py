"""What infera-attn-paged declares to the plugin. Plain data: imports nothing but ``infera_vllm.spec``."""

from infera_vllm.spec import GPU_FAMILIES, OpSpec, Switch, Symbol

_REGISTRY = "vllm.v1.attention.backends.registry"
_TRITON = "vllm.v1.attention.backends.triton_attn"

SPEC = OpSpec(
    name="attn-paged",
    distribution="infera-attn-paged",
    seam="attention backend in vLLM's registry (CUSTOM slot), subclassing TRITON_ATTN",
    vllm=">=0.24,<0.33",
    requires=(
        Symbol(_REGISTRY, "register_backend", params=("backend", "class_path")),
        Symbol(_REGISTRY, "AttentionBackendEnum.CUSTOM"),
        Symbol(_TRITON, "TritonAttentionBackend"),
        Symbol(_TRITON, "TritonAttentionImpl.forward",
               params=("layer", "query", "key", "value", "kv_cache", "attn_metadata", "output")),
        Symbol(_TRITON, "TritonAttentionImpl.do_kv_cache_update",
               params=("layer", "key", "value", "kv_cache", "slot_mapping")),
        Symbol(_TRITON, "TritonAttentionMetadataBuilder.__init__",
               params=("kv_cache_spec", "layer_names", "vllm_config", "device")),
        Symbol(_TRITON, "TritonAttentionMetadataBuilder.build", params=("common_prefix_len", "common_attn_metadata")),
        # The KV-cache layout interface changed: a shape function up to 0.26, layouts from 0.32 on.
        Symbol(_TRITON, "TritonAttentionBackend.get_kv_cache_shape", vllm="<0.27"),
        Symbol(_TRITON, "TritonAttentionBackend.supported_kv_cache_layouts", vllm=">=0.32"),
    ),
    gpu_families=GPU_FAMILIES,
    activate="infera_ops.attn_paged.seam:activate",
    plan="infera_ops.attn_paged.seam:plan",
    sites=("attention",),
    # bf16 output and probability roundings: up to 7e-3 of the output's largest element against the fp32
    # reference (decode and prefill, head sizes 64-128, measured under Triton's interpreter); vLLM's Triton
    # kernel carries the same roundings, so the two may differ by twice that
    self_check_bound=3e-2,
    switches=(
        Switch("INFERA_ATTN_PAGED_PREFILL", "choice", "auto", choices=("auto", "fa3", "kernel", "triton"),
               doc="who serves prefill and mixed batches: FA3 where it runs (auto, fa3), the ragged kernel, "
                   "or vLLM's Triton attention"),
        Switch("INFERA_ATTN_PAGED_DEFAULT", "flag", False,
               doc="the backend becomes vLLM's automatic attention choice where its validation lets it; "
                   "unset: on the GPU families measured not to lose end to end (policy.AUTOMATIC_BY_DEFAULT)"),
        Switch("INFERA_ATTN_PAGED_TUNING", "path",
               doc="decode tuning file replacing the family's tuning/<family>.json"),
    ),
)
