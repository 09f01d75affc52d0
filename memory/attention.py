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

With gradients, one autograd Function (`Attend`) does a layer's attention: the scores, the
position term, the masked softmax and the attended values, with a backward pass written for
them. A layer's attention is a few matrix products and a dozen element-wise operations on a
small model; recorded by autograd one by one (views included) and replayed as many again in
the backward pass, their fixed cost per operation outweighed their arithmetic.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memory.config import MemoryConfig
from memory.linear import Linear


class Segment(NamedTuple):
    """Keys attended to jointly with the other segments of the same call."""

    keys: Tensor  # (B, H, head_dim, N)
    values: Tensor  # (B, H, N, head_dim)
    log_mask: Tensor  # (B, 1 or H, Q, N): log m_ti, -inf where the query must not look


class LogMask(torch.autograd.Function):
    """log m, -inf where m = 0; its gradient 1 / m where m is at least the smallest normal
    float and 0 elsewhere, so that a masked key passes no gradient back to its mask."""

    @staticmethod
    def forward(ctx, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return mask.log()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (mask,) = ctx.saved_tensors
        return torch.where(mask >= torch.finfo(mask.dtype).tiny, grad / mask, 0.0)


def log_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """log m for the softmax (eq. 4); -inf where m = 0, with a finite gradient elsewhere."""
    if mask.dtype == torch.bool:
        return mask.to(dtype).log()
    return LogMask.apply(mask) if mask.requires_grad else mask.log()


class PositionWindow:
    """The keys that get a position term (A.1): the last ``width`` keys of a call. Each key's
    term q_t . p_{t-i} is looked up in the products of the queries with the embeddings p_d
    (H, reach, head_dim) between two zero rows (`table`; (B, H, Q, reach + 2)): by skewing
    them where the window's keys are the consecutive time steps ending with the last query
    (``window`` None; the embeddings from the longest distance down), else by each key's
    distance from each query (``window`` (B, width): first query - i; the zero rows stand
    for keys after the query and for distances >= reach)."""

    def __init__(
        self,
        width: int,
        window: Tensor | None,
        queries: int,
        reach: int,
        rows: Tensor | None = None,
    ) -> None:
        """``rows``: instead of ``window``, one query's rows 1 + (t - i) (B, width), which a
        step (`MemoryAttention.step`) has from its mask's offsets."""
        self.width, self.reach = width, reach
        self.index = index = None  # the row 1 + (t - i) of p_{t-i}, clamped to the zero rows
        if window is not None and queries > 1:
            after = torch.arange(1, queries + 1, device=window.device)
            index = after.view(-1, 1) + window.view(-1, 1, 1, width)
        elif window is not None or rows is not None:
            index = (window + 1 if rows is None else rows).view(-1, 1, 1, width)
        if index is not None:  # (B, 1, Q, width): the same for every head
            self.index = index.clamp(0, reach + 1)

    def table(self, position: Tensor) -> Tensor:
        """The embeddings (H, reach, head_dim) between zero rows, in the order the lookup takes."""
        return F.pad(position if self.index is not None else position.flip(1), (0, 0, 1, 1))

    def position_gradient(self, d_table: Tensor) -> Tensor:
        """The embeddings' gradient from that of `table`."""
        d_position = d_table[:, 1 : self.reach + 1]
        return d_position if self.index is not None else d_position.flip(1)

    def term(self, products: Tensor) -> Tensor:
        """q_t . p_{t-i} (B, H, Q, width), 0 where t - i >= reach or i > t."""
        if self.index is not None:
            if products.shape[2] == 1:  # a step: one operation
                return torch.take_along_dim(products, self.index, -1)
            # a block: not take_along_dim, which wraps negative indices by a remainder over the
            # index broadcast to every head, dearer than the lookup
            return torch.gather(products, -1, self.index.expand(-1, products.shape[1], -1, -1))
        # row q shifted right by q: column c then holds the key at time first - reach + 1 + c
        batch, heads, queries, _ = products.shape
        columns = self.reach - 1 + queries
        by_time = F.pad(products[..., 1:], (0, queries - 1)).flatten(2)
        by_time = by_time[..., : queries * columns].view(batch, heads, queries, columns)
        return by_time[..., columns - self.width :]

    def gradient(self, grad: Tensor) -> Tensor:
        """The gradient of the products (B, H, Q, reach + 2) from that of the term."""
        batch, heads, queries, _ = grad.shape
        if self.index is not None:
            products = grad.new_zeros(batch, heads, queries, self.reach + 2)
            return products.scatter_add_(-1, self.index.expand(-1, heads, -1, -1), grad)
        columns = self.reach - 1 + queries
        by_time = F.pad(grad, (columns - self.width, 0)).flatten(2)
        by_offset = F.pad(by_time, (0, queries)).view(batch, heads, queries, self.reach + queries)
        return F.pad(by_offset[..., : self.reach + 1], (1, 0))


def attend(
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    log_m: Tensor,
    position: Tensor,
    window: PositionWindow,
    dropout: float,
    shape: tuple[int, ...] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The attended values (B, Q, H * head_dim), or of ``shape``, and the weights (B, H, Q, N)
    of queries q (B, H, Q, head_dim) over keys (B, H, head_dim, N) and values
    (B, H, N, head_dim) with the log mask (B, 1 or H, Q, N); and, for `Attend`'s backward
    pass, the position table and the dropout's noise (None without dropout)."""
    batch, heads, length, head_dim = q.shape
    scale = head_dim**-0.5
    scores = torch.add(log_m, torch.matmul(q, keys), alpha=scale)
    table = window.table(position)
    near = scores if window.width == scores.shape[-1] else scores[..., -window.width :]
    near.add_(window.term(torch.einsum("bhqd,hrd->bhqr", q, table)), alpha=scale)
    weights = torch.softmax(scores, -1)  # eq. 4 through the log mask
    noise, attended = None, weights
    if dropout > 0:  # (drawn as nn.Dropout draws it)
        noise = torch.empty_like(weights).bernoulli_(1 - dropout).div_(1 - dropout)
        attended = weights * noise
    out = torch.einsum("bhqn,bhnd->bqhd", attended, values).reshape(shape or (batch, length, -1))
    return out, weights, table, noise


class Attend(torch.autograd.Function):
    """`attend` and its backward pass: from the weights, the queries and the position
    lookup it keeps, about twenty operations give the gradients of the queries, keys,
    values, log mask and position embeddings."""

    @staticmethod
    def forward(
        ctx,
        q: Tensor,
        keys: Tensor,
        values: Tensor,
        log_m: Tensor,
        position: Tensor,
        window: PositionWindow,
        dropout: float,
    ) -> tuple[Tensor, Tensor]:
        out, weights, table, noise = attend(q, keys, values, log_m, position, window, dropout)
        ctx.save_for_backward(q, keys, values, weights, table, noise)
        ctx.window, ctx.mask_shape = window, log_m.shape
        ctx.mark_non_differentiable(weights)
        ctx.set_materialize_grads(False)  # (no zeros made for the weights' gradient)
        return out, weights

    @staticmethod
    def backward(ctx, grad: Tensor, _: None) -> tuple[Tensor | None, ...]:
        q, keys, values, weights, table, noise = ctx.saved_tensors
        batch, heads, length, head_dim = q.shape
        window = ctx.window
        grad = grad.view(batch, length, heads, head_dim)
        attended = weights if noise is None else weights * noise
        d_attended = torch.einsum("bqhd,bhnd->bhqn", grad, values)
        if noise is not None:
            d_attended *= noise
        d_scores = torch._softmax_backward_data(d_attended, weights, -1, weights.dtype)
        d_scaled = d_scores * head_dim**-0.5  # (of the products, scaled in the scores)
        d_products = window.gradient(d_scaled[..., d_scaled.shape[-1] - window.width :])
        d_q = torch.einsum("bhqn,bhdn->bhqd", d_scaled, keys)
        d_q += torch.matmul(d_products, table)
        d_keys = torch.einsum("bhqd,bhqn->bhdn", q, d_scaled)
        d_values = torch.einsum("bhqn,bqhd->bhnd", attended, grad)
        d_log_m = d_scores.sum_to_size(ctx.mask_shape) if ctx.needs_input_grad[3] else None
        d_position = None
        if ctx.needs_input_grad[4]:
            # (by heads first: a copy whose rows stay whole, where the einsum's own copy of
            # (B, H, Q, reach + 2) transposed every row, at three times the product's time)
            by_head = d_products.transpose(0, 1).contiguous().transpose(0, 1)
            d_table = torch.einsum("bhqr,bhqd->hrd", by_head, q)
            d_position = window.position_gradient(d_table)
        return d_q, d_keys, d_values, d_log_m, d_position, None, None


class MemoryAttention(nn.Module):
    """Projections, relative position term (A.1) and renormalised attention (eq. 4)."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.dim = cfg.dim
        self.heads = cfg.num_heads
        self.head_dim = cfg.head_dim
        self.qkv = Linear(cfg.dim, 3 * cfg.dim)  # eq. 1: q, k, v = W_q h, W_k h, W_v h
        self.out = Linear(cfg.dim, cfg.dim)  # eq. 2: W_o
        # p_d for distances d = 0 .. block_len-1, one set per head (A.1)
        self.position = nn.Parameter(0.02 * torch.randn(cfg.num_heads, cfg.block_len, cfg.head_dim))
        self.dropout = cfg.dropout

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, H, Q, hd), keys (B, H, hd, Q) and values (B, H, Q, hd) of x (B, Q, dim)."""
        batch, length, _ = x.shape
        qkv = self.qkv(x)
        if length == 1:  # (the same layout as below, without its permutation)
            q, k, v = qkv.view(batch, 3, self.heads, 1, self.head_dim).unbind(1)
        else:
            qkv = qkv.view(batch, length, 3, self.heads, self.head_dim)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        return q, k.mT, v

    def project_step(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The query, key and value of a step's x (B, dim), each (B, H, 1, hd): the key as a
        step's memory keeps it (`memory.store.STEP_SLOT`), not transposed."""
        return self.qkv(x).view(x.shape[0], 3, self.heads, 1, self.head_dim).unbind(1)

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
        keys, values, log_m = segments[0] if len(segments) == 1 else joined(segments)
        window = PositionWindow(width, window, q.shape[2], self.position.shape[1])
        dropout = self.dropout if self.training else 0.0
        inputs = (q, keys, values, log_m, self.position, window, dropout)
        if torch.is_grad_enabled() and not torch.is_autocast_enabled(q.device.type):
            attended, weights = Attend.apply(*inputs)
        else:  # plain operations: torch.export traces them for compiled acting, and autograd
            # differentiates them under autocast, whose mixed dtypes Attend's backward leaves out
            attended, weights = attend(*inputs)[:2]
        return self.out(attended), weights if keep_weights else None

    def step(self, q: Tensor, segment: Segment, relative: Tensor) -> Tensor:
        """`forward` for a step without gradients over a whole buffer (`MemoryKind.read_buffer`)
        whose memories are at time offsets ``relative`` = i - t (B, N) from the step's query q
        (B, H, 1, hd); returns the output (B, dim). The position rows come from the offsets its
        mask was computed from, with no other operation."""
        reach = self.position.shape[1]
        window = PositionWindow(relative.shape[1], None, 1, reach, rows=1 - relative)
        dropout = self.dropout if self.training else 0.0
        return self.out(attend(q, *segment, self.position, window, dropout, (len(q), -1))[0])

    def position_term(self, q: Tensor, width: int, window: Tensor | None) -> Tensor:
        """q_t . p_{t-i} for the last ``width`` keys, 0 where t - i >= block_len (A.1)."""
        lookup = PositionWindow(width, window, q.shape[2], self.position.shape[1])
        return lookup.term(torch.einsum("bhqd,hrd->bhqr", q, lookup.table(self.position)))


def joined(segments: list[Segment]) -> Segment:
    """The segments' keys as one segment, in order."""
    keys, values, log_masks = zip(*segments, strict=True)
    return Segment(torch.cat(keys, -1), torch.cat(values, 2), torch.cat(log_masks, -1))
