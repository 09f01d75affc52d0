"""A linear layer whose backward pass is three operations.

`nn.Linear`'s backward, as autograd records it, is about nine operations (the flattening
views of its input and output, the transposes around two matrix products, the bias's sum);
on a small model that fixed cost per operation outweighs the products. `Linear` computes the
same gradients with one product each for the input and the weight and one sum for the bias.
It is an `nn.Linear` (same parameters, initialisation and checkpoints); under autocast and
without gradients it is `nn.Linear` itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LinearFunction(torch.autograd.Function):
    """x W^T + b over the last dimension of x, and its gradients."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        ctx.save_for_backward(x, weight)
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        d_x = torch.matmul(grad, weight) if need_x else None
        d_weight = torch.einsum("...o,...i->oi", grad, x) if need_weight else None
        d_bias = grad.sum(tuple(range(grad.dim() - 1))) if need_bias else None
        return d_x, d_weight, d_bias


class Linear(nn.Linear):
    """`nn.Linear` with `LinearFunction`'s backward pass."""

    def forward(self, x: Tensor) -> Tensor:
        if torch.is_grad_enabled() and not torch.is_autocast_enabled(x.device.type):
            return LinearFunction.apply(x, self.weight, self.bias)
        return super().forward(x)
