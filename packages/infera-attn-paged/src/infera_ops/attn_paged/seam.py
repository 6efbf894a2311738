"""Placeholder seam until the paged-attention backend lands (issue #4)."""

from infera_vllm.placeholder import not_implemented

check, activate = not_implemented("the paged-attention backend lands with issue #4")
