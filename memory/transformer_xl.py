"""Fixed span (Transformer-XL, Dai et al. 2019): C_t = {t - L, ..., t - 1}."""

from __future__ import annotations

from torch import Tensor

from memory.kind import MemoryKind


class TransformerXL(MemoryKind):
    """A fixed span: every query sees the last L hidden states of its episode; older ones
    are deleted."""

    name = "transformer_xl"
    consecutive = True  # deleted by age and episode only

    def mask(self, relative: Tensor, span: Tensor | None, offsets: Tensor | None) -> Tensor:
        if offsets is None:
            return (relative >= -self.max_span)[:, None, :]
        return relative[:, None, :] >= (offsets - self.max_span)[:, None]  # t - i <= L
