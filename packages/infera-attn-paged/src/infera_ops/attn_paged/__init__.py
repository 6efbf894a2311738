"""A Triton paged-attention backend for vLLM, specialised for decode."""
