"""The dispatch guard: which experts calls the decode kernel takes. Plain checks on what vLLM passes to
``FusedMoEExpertsModular.apply``; a reason code for every call it does not take."""

import torch

DTYPES = (torch.bfloat16, torch.float16)
# by design (vLLM's kernel is the better one there), not a capability limit: coverage route "handover"
HANDOVERS = ("tokens-above-threshold",)


def decline_reason(hidden_states, w1, w2, topk_ids, activation, expert_map, apply_router_weight_on_input,
                   a1q_scale, w1_bias, w2_bias, max_tokens: int) -> str | None:
    """None when the kernel can serve the call, else a reason code."""
    if hidden_states.dim() != 2 or hidden_states.shape[0] > max_tokens:
        return "tokens-above-threshold"
    if hidden_states.dtype not in DTYPES:
        return "dtype"
    if w1.dtype != hidden_states.dtype or w2.dtype != hidden_states.dtype or a1q_scale is not None:
        return "weight-dtype"
    if str(getattr(activation, "value", activation)).lower() != "silu":
        return "activation"
    if expert_map is not None:
        return "expert-map"  # expert parallel: global ids would need mapping to local experts
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
