"""Adaptive attention span (Sukhbaatar et al. 2019a): every head learns how far it looks.

Head h attends to distance t - i with weight factor m = clamp(1 + (z_h - (t - i)) / R, 0, 1)
(the same ramp as Expire-Span's eq. 5, but one span z_h = L s_h per head, independent of
the content), and the loss gets the L1 penalty alpha * mean_h z_h per layer. As in the
original, s_h is kept in [0, 1] by projecting it back after every update (done here at the
start of each training call, so no training loop has to know about it). The memory is
trimmed to the longest span of the layer's heads plus the ramp.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from memory.config import MemoryConfig
from memory.kind import Call, MemoryKind, Read, ramp_mask
from memory.store import Slots


class AdaptiveSpan(MemoryKind):
    """A learned span per head with the ramp mask and its L1 span loss."""

    name = "adaptive_span"
    consecutive = True  # deleted by age (the longest head span) and episode only
    steps_in_buffer = True  # ``read`` only projects the spans; ``spans()`` clamps them anyway
    penalises_span = True

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__(cfg)
        self.ramp = cfg.ramp
        self.coef = cfg.aux_loss_coef
        self.span_fraction = nn.Parameter(torch.full((cfg.num_heads,), cfg.init_span_fraction))

    def spans(self) -> Tensor:
        """z_h = L s_h for every head, (H,)."""
        return self.max_span * self.span_fraction.clamp(0, 1)

    def mask(self, relative: Tensor, span: Tensor | None, offsets: Tensor | None) -> Tensor:
        return ramp_mask(self.ramp_start(relative, span), offsets, self.ramp)  # (B, H, Q, N)

    def ramp_start(self, relative: Tensor, span: Tensor | None) -> Tensor:
        return 1 + (self.spans()[:, None] + relative[:, None, :]) / self.ramp  # (B, H, N)

    def loss(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        return self.coef * self.spans().mean()

    def read(self, *args) -> Read:
        if self.training:  # projection after the optimizer's last update, through ``data``:
            # nothing read from the device, and autograd's version of s_h stays
            self.span_fraction.data.clamp_(0, 1)
        return super().read(*args)
