"""fp32 torch reference of the SwiGLU MoE experts (tests and benchmarks import it)."""

import torch
import torch.nn.functional as F


def moe_experts_reference(x, w13, w2, topk_weights, topk_ids):
    """out[m] = sum_k r[m,k] * W2[e] @ (silu(W13[e,:I] @ x[m]) * (W13[e,I:] @ x[m])), e = ids[m,k]; fp32."""
    inter = w13.shape[1] // 2
    xf, w13f, w2f = x.float(), w13.float(), w2.float()
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for m in range(x.shape[0]):
        for k in range(topk_ids.shape[1]):
            e = int(topk_ids[m, k])
            gate_up = w13f[e] @ xf[m]
            act = F.silu(gate_up[:inter]) * gate_up[inter:]
            out[m] += float(topk_weights[m, k]) * (w2f[e] @ act)
    return out
