"""Repository-wide test setup: under Triton's interpreter (TRITON_INTERPRET=1) its fp32 -> bf16 conversions
round to nearest even, as on GPUs (infera_vllm.triton_dot.round_bf16_like_gpus), so the kernels' CPU tests
see the roundings the GPU gives. vLLM engines that tests start get the same from the plugin."""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    from infera_vllm import triton_dot

    triton_dot.round_bf16_like_gpus()
