"""Placeholder seam until the tuned BLASLt linear lands (issue #6)."""

from infera_vllm.placeholder import not_implemented

check, activate = not_implemented("the tuned BLASLt linear lands with issue #6")
