"""Multi-head attention over [memory; current block] with masking and renormalisation.

The memory mask m_ti multiplies the attention weights, which are then renormalised
(eq. 4): a'_ti = m_ti a_ti / sum_j m_tj a_tj. Written as a softmax of the scores plus
log m_ti, this is exact and numerically safe: the softmax subtracts the largest
*surviving* score, so no weight underflows to 0/0 when the best-scoring keys are masked,
and keys with m_ti = 0 get exactly zero weight (and zero gradient). The gradient with
respect to m_ti is that of eq. 4, which is how Expire-Span's spans learn.

Relative position embeddings (Shaw et al. 2018) add q_t . p_{t-i} to the score, but only
for distances t - i < block_len (A.1): older memories get none, so the position term
costs O(block_len) per query whatever the maximum span, and it depends only on t - i, so
step mode and block mode agree.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memory.config import MemoryConfig


class Segment(NamedTuple):
    """Keys attended to jointly with the other segments of the same call."""

    keys: Tensor  # (B, H, head_dim, N)
    values: Tensor  # (B, H, N, head_dim)
    log_mask: Tensor  # (B, 1 or H, Q, N): log m_ti, -inf where the query must not look


def log_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """log m for the softmax (eq. 4); -inf where m = 0, with a finite gradient elsewhere."""
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, -math.inf
        )
    if not mask.requires_grad:
        return mask.log()
    tiny = torch.finfo(mask.dtype).tiny
    return torch.where(mask > 0, mask.clamp_min(tiny).log(), -math.inf)


def split(segment: Segment, at: int) -> list[Segment]:
    """The segment's keys before ``at`` and from ``at`` on, as two segments."""
    keys, values, log_m = segment
    return [
        Segment(keys[..., :at], values[:, :, :at], log_m[..., :at]),
        Segment(keys[..., at:], values[:, :, at:], log_m[..., at:]),
    ]


class MemoryAttention(nn.Module):
    """Projections, relative position term (A.1) and renormalised attention (eq. 4)."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)  # eq. 1: q, k, v = W_q h, W_k h, W_v h
        self.out = nn.Linear(cfg.dim, cfg.dim)  # eq. 2: W_o
        # p_d for distances d = 0 .. block_len-1, one set per head (A.1)
        self.position = nn.Parameter(0.02 * torch.randn(cfg.num_heads, cfg.block_len, cfg.head_dim))
        self.dropout = nn.Dropout(cfg.dropout)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, Q, hd), keys (B, H, hd, Q) and values (B, H, Q, hd) of x (B, Q, dim)."""
        batch, length, _ = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim)
        return (
            qkv[:, :, 0].transpose(1, 2),
            qkv[:, :, 1].permute(0, 2, 3, 1),
            qkv[:, :, 2].transpose(1, 2),
        )

    def key_value(self, hidden: Tensor) -> tuple[Tensor, Tensor]:
        """Keys (B, H, hd, N) and values (B, H, N, hd) of memories (B, N, dim), current weights."""
        batch, length, _ = hidden.shape
        kv = F.linear(hidden, self.qkv.weight[self.dim :], self.qkv.bias[self.dim :])
        kv = kv.view(batch, length, 2, self.heads, self.head_dim)
        return kv[:, :, 0].permute(0, 2, 3, 1), kv[:, :, 1].transpose(1, 2)

    def forward(
        self,
        q: Tensor,
        segments: list[Segment],
        width: int,
        window: Tensor | None,
        keep_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend with queries q (B, H, Q, hd) over the segments' keys; returns the output
        and, with ``keep_weights``, the attention weights a'_ti (B, H, Q, keys), detached.

        The last ``width`` keys of the last segment are those that can be closer than
        block_len to a query (the most recent memories and the call's own steps). ``window``
        (B, width) gives their distance from the first query, first - i; None means they are
        exactly the consecutive time steps ending with the last query.
        """
        batch, heads, length, _ = q.shape
        q = q * self.scale
        older = segments[-1].values.shape[2] - width
        if older and torch.is_grad_enabled():  # no in-place writes into autograd's tensors
            segments = segments[:-1] + split(segments[-1], older)
            older = 0
        scores = []
        for segment in segments:
            s = torch.matmul(q, segment.keys)
            s += segment.log_mask
            scores.append(s)
        position = self.position_term(q, width, window)
        if older:  # only without autograd
            scores[-1][..., older:] += position
        else:  # not through a view, which autograd would copy whole in the backward pass
            scores[-1] += position
        weights = scores[0] if len(scores) == 1 else torch.cat(scores, -1)
        weights = torch.softmax(weights, -1)  # eq. 4 through the log mask
        kept = weights.detach() if keep_weights else None
        if self.dropout.p > 0:
            weights = self.dropout(weights)
        if len(segments) == 1:
            out = torch.matmul(weights, segments[0].values)
        else:
            parts = weights.split([s.values.shape[2] for s in segments], -1)
            out = sum(torch.matmul(w, s.values) for w, s in zip(parts, segments, strict=True))
        out = out.transpose(1, 2).reshape(batch, length, heads * self.head_dim)
        return self.out(out), kept

    def position_term(self, q: Tensor, width: int, window: Tensor | None) -> Tensor:
        """q_t . p_{t-i} for the last ``width`` keys, 0 where t - i >= block_len (A.1)."""
        batch, heads, length, head_dim = q.shape
        reach = self.position.shape[1]
        queries = q.transpose(0, 1).reshape(heads, batch * length, head_dim)  # no broadcast copy
        if length == 1:  # step mode: look the distance up directly
            by_distance = torch.bmm(queries, self.position.transpose(1, 2))
            by_distance = by_distance.view(heads, batch, 1, reach).transpose(0, 1)
            index = window.clamp(max=reach - 1)[:, None, None, :].expand(batch, heads, 1, width)
            term = by_distance.gather(-1, index)
            return term.masked_fill_((window >= reach)[:, None, None, :], 0.0)  # no embedding
        # block mode: by_time[q, c] = q_t . p_{t-i} for the key i at time (first - reach + 1 + c),
        # by skewing the products with the reversed table: row q shifted right by q
        columns = reach - 1 + length
        by_offset = torch.bmm(queries, self.position.flip(1).transpose(1, 2))
        by_offset = by_offset.view(heads, batch, length, reach).transpose(0, 1)
        by_time = F.pad(by_offset, (0, length)).flatten(2)[..., : length * columns]
        by_time = by_time.view(batch, heads, length, columns)
        if window is None:  # the window's keys are the last ``width`` time steps
            return by_time if width == columns else by_time[..., columns - width :]
        # a hole in the window: look every key up by its distance from the first query
        by_time = F.pad(by_time, (1, 0))  # column 0: keys without a position embedding
        index = (reach - window).clamp_min(0)[:, None, None, :].expand(batch, heads, length, width)
        return by_time.gather(-1, index)
