"""A small-batch SwiGLU MoE experts kernel for vLLM decode."""
