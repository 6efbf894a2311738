"""fp32 torch reference of the SwiGLU MoE experts (tests, benchmarks and the serving self-check import it)."""

import torch
import torch.nn.functional as F


def moe_experts_reference(x, w13, w2, topk_weights, topk_ids, expert_map=None, scales=None):
    """out[m] = sum_k r[m,k] * W2[e] @ (silu(W13[e,:I] @ x[m]) * (W13[e,I:] @ x[m])), e = ids[m,k]; fp32.

    ``x`` [M, H], ``w13`` [E, 2I, H], ``w2`` [E, H, I], ``topk_weights``/``topk_ids`` [M, K];
    ``expert_map`` (expert parallel): global id -> local index, -1 where another rank holds the expert (it
    adds nothing here). One pass per distinct expert the tokens route to, converting only that expert's
    weights to fp32, so that a serving-size layer (tens of GB of experts) costs a fraction of a second and no more
    memory than one expert in fp32. ``scales`` (``launch.ExpertScales``): FP8 weights, each expert dequantized
    by ``dequantize_experts`` as it is used."""
    inter = w13.shape[1] // 2
    ids = topk_ids.long() if expert_map is None else expert_map[topk_ids.long()].long()
    flat, weights = ids.reshape(-1), topk_weights.reshape(-1).float()
    token = torch.arange(x.shape[0], device=x.device).repeat_interleave(ids.shape[1])
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in torch.unique(flat).tolist():
        if e < 0:
            continue
        rows = (flat == e).nonzero().squeeze(1)
        if scales is None:
            w13e, w2e = w13[e].float(), w2[e].float()
        else:
            w13e = dequantize_experts(w13[e:e + 1], scales.w13[e:e + 1], scales.block)[0]
            w2e = dequantize_experts(w2[e:e + 1], scales.w2[e:e + 1], scales.block)[0]
        gate_up = x[token[rows]].float() @ w13e.t()
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out.index_add_(0, token[rows], weights[rows, None] * (act @ w2e.t()))
    return out


def dequantize_experts(w, scale, block=None):
    """FP8 experts ``w`` ``[E, N, K]`` in fp32: ``w[e, n, k] * scale[e, n // bn, k // bk]`` for ``block`` (bn, bk),
    else ``scale`` per tensor (``[E]``), per channel (``[E, N]``) or, for gate/up weights, per half (``[E, 2]``);
    the layouts of ``launch.ExpertScales``."""
    E, N, K = w.shape
    s = scale.float()
    if block is not None:
        bn, bk = block
        s = s.repeat_interleave(bn, dim=1)[:, :N].repeat_interleave(bk, dim=2)[:, :, :K]
    else:
        s = s.reshape(E, -1)
        s = s.repeat_interleave(N // s.shape[1], dim=1)[:, :, None]
    return w.float() * s
