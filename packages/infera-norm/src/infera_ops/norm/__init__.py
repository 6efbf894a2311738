"""RMSNorm and fused add+RMSNorm Triton kernels for vLLM, as a vLLM IR provider."""
