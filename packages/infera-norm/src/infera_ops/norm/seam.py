"""Placeholder seam until the Triton RMSNorm kernel lands (issue #3)."""

from infera_vllm.placeholder import not_implemented

check, activate = not_implemented("the Triton RMSNorm kernel lands with issue #3")
