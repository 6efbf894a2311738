"""Placeholder seam until the decode MoE experts kernel lands (issue #5)."""

from infera_vllm.placeholder import not_implemented

check, activate = not_implemented("the decode MoE experts kernel lands with issue #5")
