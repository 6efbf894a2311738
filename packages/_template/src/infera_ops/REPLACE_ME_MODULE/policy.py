"""REPLACE_ME: which calls the kernel takes, with a reason code for every call it does not take, and the
per-GPU-family launch settings from ``tuning/<family>.json``.

Plain checks on what vLLM passes (imports torch, never vLLM), so the decisions are unit-testable apart from the
seam. Reasons in ``HANDOVERS`` are by design (vLLM's kernel measured faster there: coverage route
``handover``); every other reason is a capability the kernel lacks (route ``fallback``).
"""

import torch

from infera_ops.REPLACE_ME_MODULE.launch import LaunchConfig
from infera_ops.REPLACE_ME_MODULE.spec import SPEC
from infera_vllm import tuning_files
from infera_vllm.switches import op_value

DTYPES = (torch.bfloat16, torch.float16)
HANDOVERS: tuple[str, ...] = ()


class TuningError(ValueError):
    """A tuning file that cannot be used (the op declines ``bad-tuning`` with this message)."""


def decline_reason(x: torch.Tensor) -> str | None:
    """None when the kernel serves the call, else a reason code (REPLACE_ME: one check per capability)."""
    if x.dtype not in DTYPES:
        return "dtype"
    if x.dim() != 2 or x.stride(-1) != 1:
        return "layout"
    return None


def _parse(text: str, source: str) -> LaunchConfig:
    doc = tuning_files.document(text, source, TuningError)
    return LaunchConfig(**doc.get("config", {}))


def load(family: str) -> LaunchConfig | None:
    """The family's launch settings (``INFERA_REPLACE_ME_TUNING`` replaces the packaged file), or None where it
    has none; seam.check calls it, so a file that cannot be used declines the op at startup."""
    return tuning_files.load("infera_ops.REPLACE_ME_MODULE", family, "INFERA_REPLACE_ME_TUNING",
                             op_value(SPEC, "INFERA_REPLACE_ME_TUNING"), _parse, TuningError)
