"""fp32 torch reference of the linear (tests and benchmarks import it)."""

import torch


def linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.float() @ weight.float().t()
    return y + bias.float() if bias is not None else y
