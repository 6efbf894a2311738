"""The dispatch guard: which experts calls the decode kernel takes. Plain checks on what vLLM passes to
``FusedMoEExpertsModular.apply``; a reason code for every call it does not take."""

from collections.abc import Callable

import torch

DTYPES = (torch.bfloat16, torch.float16)
# by design (vLLM's kernel is the better one there), not a capability limit: coverage route "handover"
HANDOVERS = ("tokens-above-threshold",)


def decline_reason(hidden_states, w1, w2, topk_ids, activation, expert_map, apply_router_weight_on_input,
                   a1q_scale, w1_bias, w2_bias, serves: Callable[[int, int, int, int, int], bool]) -> str | None:
    """None when the kernel can serve the call, else a reason code. ``serves(M, E, H, I, top-k)``: whether the
    family's tuning takes M tokens for this expert shape (``Tuning.serves``); an expert map (expert parallel)
    is served: the kernel skips the experts held elsewhere."""
    if (hidden_states.dim() != 2 or topk_ids.dim() != 2 or w1.dim() != 3
            or not serves(hidden_states.shape[0], w1.shape[0], w1.shape[2], w1.shape[1] // 2, topk_ids.shape[1])):
        return "tokens-above-threshold"
    if hidden_states.dtype not in DTYPES:
        return "dtype"
    if w1.dtype != hidden_states.dtype or w2.dtype != hidden_states.dtype or a1q_scale is not None:
        return "weight-dtype"
    if str(getattr(activation, "value", activation)).lower() != "silu":
        return "activation"
    if expert_map is not None and (expert_map.dim() != 1 or expert_map.device != hidden_states.device):
        return "expert-map"
    if apply_router_weight_on_input:
        return "router-weight-on-input"
    if w1_bias is not None or w2_bias is not None:
        return "bias"
    E, two_i, H = w1.shape
    if (w2.shape != (E, H, two_i // 2) or hidden_states.shape[1] != H or w1.stride(-1) != 1 or w2.stride(-1) != 1
            or hidden_states.stride(-1) != 1):
        return "layout"
    if hidden_states.device.type not in ("cuda", "cpu"):
        return "device"
    return None
