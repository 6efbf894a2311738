"""Which norm calls the kernel takes: plain checks on the tensors vLLM's IR passes (``decline_reason``), a
reason code for every call it does not take, and the switches that move the hand-overs (seam.py explains each
hand-over: ``eager-launch-cost``, ``per-head-fusion``, ``vllm-c-faster``). Imports torch only (no vLLM).
"""

from typing import Optional

import torch
from torch import Tensor
from torch.fx.experimental.symbolic_shapes import guard_or_false

from infera_ops.norm.spec import SPEC
from infera_vllm.switches import op_value

DTYPES = (torch.bfloat16, torch.float16)
MAX_HIDDEN = 16384  # the kernel keeps one row in registers (BLOCK_H = next power of two)
# A norm over the last dim of a 3-D+ view at most this wide is a per-head (q/k) norm; a [batch, seq, hidden]
# activation is wider (the smallest hidden size we serve, SmolLM2's, is 576)
MAX_HEAD_DIM = 256
EAGER_NEVER = 1 << 62  # default: eager calls always go to vLLM's next provider (launch cost: seam.py)
HANDOVERS = ("eager-launch-cost", "per-head-fusion", "vllm-c-faster")  # by design, not capability limits


def eager_min_tokens() -> int:
    """Eager calls from this many tokens on are served: ``INFERA_NORM_EAGER_MIN_TOKENS`` (0 = all); unset,
    none (EAGER_NEVER)."""
    tokens = op_value(SPEC, "INFERA_NORM_EAGER_MIN_TOKENS")
    return EAGER_NEVER if tokens is None else tokens


def per_head_kernel() -> bool:
    """``INFERA_NORM_PER_HEAD_KERNEL``: 1 the kernel serves per-head norms in compiled graphs too; 0 (default)
    they go to vLLM's next provider there, for Inductor to fuse (``per-head-fusion``)."""
    return op_value(SPEC, "INFERA_NORM_PER_HEAD_KERNEL")


def vllm_c_hands_over(tokens: int, hidden: int) -> bool:
    """The fused add's shapes where vllm_c measured faster (H200 sweep): rows of >= 4096, 512-2048 tokens."""
    return hidden > 2048 and 512 <= tokens <= 2048


def concrete_tokens(x: Tensor) -> Optional[int]:
    """Tokens (rows) of x, or None while x's leading sizes are symbolic (reading them would guard)."""
    tokens = 1
    for size in x.shape[:-1]:
        if not isinstance(size, int):
            return None
        tokens *= size
    return tokens


def _flat_rows(t: Tensor) -> bool:
    """Whether ``t.view(-1, H)`` aliases t (an in-place result written there lands in t); symbolic sizes are
    compared without guarding (undecidable counts as no)."""
    if t.dim() == 2:
        return True
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if not guard_or_false(stride == expected):
            return False
        expected = expected * size
    return True


def decline_reason(x: Tensor, weight: Optional[Tensor], variance_size, residual: Optional[Tensor] = None,
                   allow_cpu: bool = False, eager_min_tokens: int = 0, per_head_to_vllm: bool = False) -> Optional[str]:
    """Why the kernel should not take this call (a reason code), or None. Reads no symbolic size."""
    if variance_size is not None:
        return "variance-size"
    if x.dtype not in DTYPES:
        return "dtype"
    if weight is not None and weight.dtype not in (x.dtype, torch.float32):
        return "weight-dtype"  # fp32 weights: vLLM's GemmaRMSNorm passes 1 + w in fp32
    if x.shape[-1] > MAX_HIDDEN:
        return "hidden-size"
    if x.stride(-1) != 1:
        return "stride"
    if residual is not None:
        # in place: both must be writable through a [M, H] view of themselves
        if residual.shape != x.shape or residual.dtype != x.dtype or residual.stride(-1) != 1:
            return "residual-layout"
        if not (_flat_rows(x) and _flat_rows(residual)):
            return "residual-layout"
    if x.device.type != "cuda" and not (allow_cpu and x.device.type == "cpu"):
        return "device"
    compiling = isinstance(x, torch._subclasses.FakeTensor) or torch.compiler.is_compiling()
    if per_head_to_vllm and residual is None and x.dim() >= 3 and x.shape[-1] <= MAX_HEAD_DIM and compiling:
        return "per-head-fusion"
    if eager_min_tokens and not compiling:
        tokens = concrete_tokens(x)
        capturing = x.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if tokens is not None and tokens < eager_min_tokens and not capturing:
            return "eager-launch-cost"
    return None
