"""Expire-Span (Sukhbaatar et al. 2021, section 4): every memory predicts how long it lives.

Auxiliary loss, as section 4.2 ("Loss Computation") has it: the L1 penalty alpha * sum_i
e_i / T of eq. 7 is not taken when memory i is written but while it is on the ramp, i.e.
for the queries t of the current call with 0 < m_ti < 1 -- the same queries through which
the task loss pushes e_i up. Memory i spends (about) R queries on the ramp, so each of
them carries 1/R of its penalty:

    aux = alpha / (R * T) * sum_{t in call} sum_{i : 0 < m_ti < 1} e_i,   averaged over the batch,

with T the number of queries in the call. Memories of earlier calls (spans recomputed
from their stored h_i with the current w, b) and memories of the current call alike are
penalised this way; summed over a memory's life the penalty is alpha * e_i / T, eq. 7.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from memory.config import MemoryConfig
from memory.kind import Call, MemoryKind, ramp_mask
from memory.linear import Linear
from memory.store import Slots


class SpanPredictor(nn.Module):
    """e_i = L sigmoid(w.h_i + b) (eq. 3), or L sigmoid((w.h_i + b) / R) (eq. 8)."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.max_span = cfg.max_span
        self.divisor = cfg.ramp if cfg.scaled_span else 1.0
        self.linear = Linear(cfg.dim, 1)
        # A.1: start with small spans: w = 0 and e_i = init_span_fraction * L for every memory
        nn.init.zeros_(self.linear.weight)
        p = cfg.init_span_fraction
        nn.init.constant_(self.linear.bias, math.log(p / (1 - p)) * self.divisor)

    def logit(self, hidden: Tensor) -> Tensor:
        """The sigmoid's argument for memories ``hidden`` (B, N, dim): (B, N), or for a step's
        memory (B, dim): (B, 1), as a step writes it (`memory.store.STEP_SLOT`); in float32
        under autocast too: in bfloat16 spans at L = 16384 were off by up to 80 positions."""
        if torch.is_autocast_enabled(hidden.device.type):
            with torch.autocast(hidden.device.type, enabled=False):
                return self.logit(hidden.float())
        logit = self.linear(hidden)
        logit = logit if hidden.dim() == 2 else logit.squeeze(-1)
        return logit / self.divisor if self.divisor != 1 else logit

    def forward(self, hidden: Tensor) -> Tensor:
        """Expire-spans of memories ``hidden`` (B, N, dim): (B, N) in [0, L]; of a step's
        memory (B, dim): (B, 1)."""
        return self.max_span * torch.sigmoid(self.logit(hidden))


def expire_mask(relative: Tensor, span: Tensor, offsets: Tensor | None, ramp: float) -> Tensor:
    """m_ti = clamp(1 + r_ti / R, 0, 1), remaining span r_ti = e_i - (t - i) (eq. 5).

    Memories at i = s + relative (B, N) with spans e_i (B, N), queries at t = s + offsets
    (Q,) (None: t = s); returns (B, Q, N)."""
    return ramp_mask(expire_start(relative, span, ramp), offsets, ramp)


def expire_start(relative: Tensor, span: Tensor, ramp: float) -> Tensor:
    """1 + r_i / R for the query at s, remaining span r_i = e_i + relative_i (eq. 5)."""
    return 1 + (span + relative) / ramp


def attended_span_loss(
    weights: Tensor,
    position: Tensor,
    span: Tensor,
    query_position: Tensor,
    threshold: float,
    margin: float = 0.0,
) -> Tensor:
    """sum_i max(0, (1 + margin) n_i - e_i), n_i the oldest age t - i at which a query gave
    memory i more than ``threshold`` of its attention (largest over heads): a memory the
    attention relies on at age n should be seen whole (m = 1) at that age, and with
    ``margin`` a little past it, so that one reading at age n keeps the memory whole to
    (1 + margin) n and in view to (1 + margin) n + R: the span reaches a task's longest
    distances in a few readings and drift must exceed the margin before a reading fails.
    ``weights`` (B, H, Q, N), memories at ``position`` (B, N) with spans ``span`` (B, N),
    queries at ``query_position`` (B, Q)."""
    relied_on = weights.amax(1) > threshold  # (B, Q, N)
    age = (query_position[:, :, None] - position[:, None, :]).to(span.dtype)
    oldest = (age * relied_on).amax(1)  # (0 where none relied on it)
    return ((1 + margin) * oldest - span).clamp_min(0).sum()


def expire_span_loss(mask: Tensor, span: Tensor, ramp: float, coef: float) -> Tensor:
    """alpha / (R T) * sum of e_i over the (query, memory) pairs on the ramp (eq. 7, 4.2).

    ``mask`` (B, T, N) is m_ti (0 for keys a query must not see), ``span`` (B, N) is e_i.
    """
    batch, queries, _ = mask.shape
    on_ramp = ((mask > 0) & (mask < 1)).sum(1)  # queries with memory i on its ramp, (B, N)
    return (on_ramp * span).sum() * (coef / (ramp * queries * batch))


class ExpireSpan(MemoryKind):
    """One expire-span per memory and layer, shared by all heads (4.2)."""

    name = "expire_span"
    stores_span = True
    penalises_span = True

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__(cfg)
        self.ramp = cfg.ramp
        self.coef = cfg.aux_loss_coef
        self.attended_coef = cfg.attended_span_coef
        self.attended_threshold = cfg.attended_threshold
        self.attended_margin = cfg.attended_margin
        self.learns_from_attention = cfg.attended_span_coef > 0
        self.memory_shortening = cfg.memory_shortening
        self.predictor = SpanPredictor(cfg)

    def span(self, hidden: Tensor) -> Tensor:
        return self.predictor(hidden)

    def mask(self, relative: Tensor, span: Tensor | None, offsets: Tensor | None) -> Tensor:
        return expire_mask(relative, span, offsets, self.ramp)

    @property
    def restricts(self) -> bool:
        return self.training and self.memory_shortening

    def ramp_start(self, relative: Tensor, span: Tensor | None) -> Tensor:
        return expire_start(relative, span, self.ramp)

    def attention_loss(self, weights: Tensor, slots: Slots, call: Call) -> Tensor:
        shortfall = attended_span_loss(
            weights,
            slots.position,
            slots.span,
            call.positions,
            self.attended_threshold,
            self.attended_margin,
        )
        return shortfall * (self.attended_coef / (weights.shape[0] * weights.shape[2]))

    def loss(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        return expire_span_loss(mask, slots.span, self.ramp, self.coef)

    def restrict(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        """Random memory shortening in training (4.2): l ~ U(0, L) per call and layer, and
        the call's queries attend only to t - i <= l; the memories stay."""
        if not self.restricts:
            return mask
        shortening = float(torch.rand(())) * self.max_span
        return mask * (slots.position[:, None, :] >= call.positions[:, :, None] - shortening)
