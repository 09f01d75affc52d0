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

Exploring spans (``memory.span_noise`` = sigma > 0; not in the paper). The ramp gives a span a
task gradient only while its memory is on the ramp, and a saturated attention makes even that
about 0 (docs/expire-span-dynamics.md), so nothing raises a span that the task needs. An
acting state draws each span as L sigmoid(w.h_i + b + sigma xi_i), xi_i ~ N(0, 1), and the
learner adds REINFORCE for that draw: -A_i xi_i / sigma * (w.h_i + b), with A_i the return
credited to memory i (``memory_credit``). xi_i is a fixed function of the memory's stream and
time index (``span_noise``), so block mode replays the spans acting drew without storing them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from memory.config import MemoryConfig
from memory.kind import Call, MemoryKind, ramp_mask
from memory.store import LayerMemory, Slots


class SpanPredictor(nn.Module):
    """e_i = L sigmoid(w.h_i + b) (eq. 3), or L sigmoid((w.h_i + b) / R) (eq. 8)."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.max_span = cfg.max_span
        self.divisor = cfg.ramp if cfg.scaled_span else 1.0
        self.linear = nn.Linear(cfg.dim, 1)
        # A.1: start with small spans: w = 0 and e_i = init_span_fraction * L for every memory
        nn.init.zeros_(self.linear.weight)
        p = cfg.init_span_fraction
        nn.init.constant_(self.linear.bias, math.log(p / (1 - p)) * self.divisor)

    def logit(self, hidden: Tensor) -> Tensor:
        """The sigmoid's argument for memories ``hidden`` (B, N, dim): (B, N)."""
        logit = self.linear(hidden).squeeze(-1)
        return logit / self.divisor if self.divisor != 1 else logit

    def forward(self, hidden: Tensor) -> Tensor:
        """Expire-spans of memories ``hidden`` (B, N, dim): (B, N) in [0, L]."""
        return self.max_span * torch.sigmoid(self.logit(hidden))


def _mul32(x: Tensor, factor: int) -> Tensor:
    """x * factor mod 2^32 for x in [0, 2^32), in int64 without overflow."""
    low, high = factor & 0xFFFF, factor >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A bijective 32-bit integer hash (MurmurHash3's finaliser)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def span_noise(stream: Tensor, position: Tensor) -> Tensor:
    """xi_i ~ N(0, 1) for memories at time indices ``position`` (B, N) of streams ``stream``
    (B,): a fixed function of both, independent across streams and time indices."""
    key = _mix32((position & 0xFFFFFFFF) ^ _mix32(stream[:, None] & 0xFFFFFFFF))
    uniform = (_mix32(key).double() + 0.5) / 2**32
    return torch.special.ndtri(uniform).float()


def memory_credit(position: Tensor, call: Call) -> Tensor:
    """The return credited to memories at ``position`` (B, N) in this call, from
    ``call.span_credit`` (B, Q): a memory written in the call gets its query's, one from
    before the call that of the call's first query, if it is of the same episode (else 0).
    Summed over the calls a memory lives through, that is the return after it."""
    offset = (position - call.start).clamp(0, call.num_queries - 1)
    credit = call.span_credit.gather(1, offset)
    return credit * (position >= call.query_begin[:, :1])


def span_policy_loss(
    logit: Tensor, noise: Tensor, credit: Tensor, noise_std: float, queries: int
) -> Tensor:
    """REINFORCE for spans drawn with logit + noise_std * noise (B, N): -credit * noise /
    noise_std * logit (the score of a Gaussian), summed and divided by the ``queries`` of
    the batch, as a policy loss is averaged over its samples."""
    return -(credit * noise * logit).sum() / (noise_std * queries)


def expire_mask(relative: Tensor, span: Tensor, offsets: Tensor | None, ramp: float) -> Tensor:
    """m_ti = clamp(1 + r_ti / R, 0, 1), remaining span r_ti = e_i - (t - i) (eq. 5).

    Memories at i = s + relative (B, N) with spans e_i (B, N), queries at t = s + offsets
    (Q,) (None: t = s); returns (B, Q, N)."""
    return ramp_mask(1 + (span + relative) / ramp, offsets, ramp)


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
    oldest = torch.where(relied_on, age, torch.zeros_like(age)).amax(1)
    return ((1 + margin) * oldest - span).clamp_min(0).sum()


def expire_span_loss(mask: Tensor, span: Tensor, ramp: float, coef: float) -> Tensor:
    """alpha / (R T) * sum of e_i over the (query, memory) pairs on the ramp (eq. 7, 4.2).

    ``mask`` (B, T, N) is m_ti (0 for keys a query must not see), ``span`` (B, N) is e_i.
    """
    batch, queries, _ = mask.shape
    on_ramp = (mask > 0) & (mask < 1)
    return (on_ramp * span[:, None, :]).sum() * (coef / (ramp * queries * batch))


class ExpireSpan(MemoryKind):
    """One expire-span per memory and layer, shared by all heads (4.2).

    Its memory holds, besides ``recent``, an exploring acting state's ``noise_stream`` (B,)
    int64: the stream of every sequence's span noise in this layer (``span_noise``).
    """

    name = "expire_span"
    stores_span = True

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__(cfg)
        self.ramp = cfg.ramp
        self.coef = cfg.aux_loss_coef
        self.noise_std = cfg.span_noise
        self.attended_coef = cfg.attended_span_coef
        self.attended_threshold = cfg.attended_threshold
        self.attended_margin = cfg.attended_margin
        self.learns_from_attention = cfg.attended_span_coef > 0
        self.memory_shortening = cfg.memory_shortening
        self.predictor = SpanPredictor(cfg)

    def initial_memory(
        self, batch: int, device: torch.device | str, dtype: torch.dtype, explore: bool
    ) -> LayerMemory:
        memory = super().initial_memory(batch, device, dtype, explore)
        if not (explore and self.noise_std > 0):
            return memory
        return memory.replace(noise_stream=torch.randint(2**31, (batch,)).to(device))

    def span(self, hidden: Tensor, position: Tensor, memory: LayerMemory) -> Tensor:
        stream = memory.get("noise_stream")
        if stream is None:
            return self.predictor(hidden)
        noise = span_noise(stream, position).to(hidden.dtype)
        return self.max_span * torch.sigmoid(self.predictor.logit(hidden) + self.noise_std * noise)

    def span_parameters(self) -> list[nn.Parameter]:
        return list(self.predictor.parameters())

    def mask(self, relative: Tensor, span: Tensor | None, offsets: Tensor | None) -> Tensor:
        return expire_mask(relative, span, offsets, self.ramp)

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

    def loss(self, mask: Tensor, slots: Slots, call: Call, memory: LayerMemory) -> Tensor:
        loss = expire_span_loss(mask, slots.span, self.ramp, self.coef)
        stream = memory.get("noise_stream")
        if call.span_credit is None or stream is None:
            return loss
        noise = span_noise(stream, slots.position).to(mask.dtype)
        credit = memory_credit(slots.position, call)
        logit = self.predictor.logit(slots.hidden.detach())  # the noise's credit trains w, b only
        queries = mask.shape[0] * mask.shape[1]
        return loss + span_policy_loss(logit, noise, credit, self.noise_std, queries)

    def restrict(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        """Random memory shortening in training (4.2): l ~ U(0, L) per call and layer, and
        the call's queries attend only to t - i <= l; the memories stay."""
        if not (self.training and self.memory_shortening):
            return mask
        shortening = float(torch.rand(())) * self.max_span
        return mask * (slots.position[:, None, :] >= call.positions[:, :, None] - shortening)
