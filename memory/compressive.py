"""Compressive memory, mean-pool variant (Rae et al. 2020).

Recent memories live in a FIFO of L = max_span steps. Memories are grouped by c
consecutive steps counted from the episode start; when the oldest memory of a group leaves
the FIFO (t - first > L), the whole group leaves it and is mean-pooled into one compressed
memory, visible to query t while L < t - first <= L + n_cm * c, i.e. the last n_cm
compressed memories are kept. Everything depends on time indices only, so step mode
(one group compressed at the end of the step in which it becomes due) and block mode
(the groups that become due during the block, pooled from [memory; block]) agree.

Memories are layer-normed layer inputs and keys/values are linear in them, so a compressed
memory's key and value are exactly the means of its group's keys and values.

Rae et al. train learned compression functions (convolutions, attention) with an auxiliary
attention-reconstruction loss; mean pooling has no parameters, so there is none here and
``aux_loss`` is 0.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from memory.attention import MemoryAttention, Segment, log_mask
from memory.config import MemoryConfig
from memory.kind import Call, MemoryKind, Read
from memory.state import LayerMemory
from memory.store import EMPTY, Slots


def mean_pool(hidden: Tensor, rate: int) -> Tensor:
    """Means of all runs of ``rate`` consecutive memories: (B, N, dim) -> (B, N-rate+1, dim)."""
    return hidden.unfold(1, rate, 1).mean(-1)


class Compressive(MemoryKind):
    """A FIFO of L recent memories plus n_cm mean-pooled groups of c evicted ones, which its
    memory keeps as ``compressed`` (position: the time index of a group's first memory)."""

    name = "compressive"
    consecutive = True  # its recent memories: a FIFO

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__(cfg)
        self.rate = cfg.compress_rate
        self.reach = cfg.max_span + cfg.num_compressed * cfg.compress_rate  # oldest t - first

    def oldest_in_fifo(self, time: Tensor, begin: Tensor) -> Tensor:
        """The oldest memory still in the FIFO for a query at ``time`` whose episode began at
        ``begin``: the first memory of the oldest group whose first memory is >= time - L."""
        behind = time - self.max_span - begin  # groups start at begin + k c, k >= 0
        groups = torch.div(behind + self.rate - 1, self.rate, rounding_mode="floor")  # ceil
        return begin + self.rate * groups.clamp_min(0)

    def initial_memory(
        self, batch: int, device: torch.device | str, dtype: torch.dtype
    ) -> LayerMemory:
        memory = super().initial_memory(batch, device, dtype)
        return memory.replace(compressed=self.empty_store(batch, device, dtype, with_span=False))

    def alive(self, slots: Slots, time: int, begin: Tensor) -> Tensor:
        """Which recent memories are still in the FIFO for a query at ``time``."""
        return slots.position >= self.oldest_in_fifo(time + torch.zeros_like(begin), begin)[:, None]

    def alive_compressed(self, slots: Slots, time: int, begin: Tensor) -> Tensor:
        return (slots.position >= time - self.reach) & (slots.position >= begin[:, None])

    def needed(self, memory: LayerMemory, time: int, begin: Tensor) -> dict[str, Tensor]:
        older = memory["compressed"].view()
        alive = self.alive_compressed(older, time, begin)
        return {**super().needed(memory, time, begin), "compressed": alive}

    def read(self, attention: MemoryAttention, memory: LayerMemory, x: Tensor, call: Call) -> Read:
        queries, recent, kept = self.extend_recent(attention, memory, x, call)
        pooled = self.compress(attention, recent, call)
        older, compressed = self.extend(
            attention, memory, "compressed", pooled, call, self.alive_compressed
        )

        time, begin = call.positions, call.query_begin
        keep = call.visible(recent.position)
        keep &= recent.position[:, None, :] >= self.oldest_in_fifo(time, begin)[:, :, None]
        first = older.position[:, None, :]  # first memory of each pooled group
        older_keep = first >= torch.maximum(begin, time - self.reach)[:, :, None]
        older_keep &= first < (time - self.max_span)[:, :, None]

        segments = [
            Segment(older.keys, older.values, log_mask(older_keep[:, None], call.dtype)),
            Segment(recent.keys, recent.values, log_mask(keep[:, None], call.dtype)),
        ]
        count = keep.sum() + older_keep.sum()
        if not call.in_place and call.next_state:
            kept = self.delete(recent, call, self.alive)
            compressed = self.delete(older, call, self.alive_compressed)
        width, window = self.window_of(recent.position, call)
        zero = torch.zeros((), dtype=call.dtype, device=count.device)
        after = memory.replace(recent=kept, compressed=compressed) if call.next_state else None
        return Read(queries, segments, width, window, zero, count, after)

    def compress(self, attention: MemoryAttention, recent: Slots, call: Call) -> Slots:
        """The groups that leave the FIFO during this call, pooled: one candidate per query.

        Candidate k has first memory at time ``start - L + k`` and becomes visible to queries
        t >= first + L + 1. Recent memories fill the columns up to the newest step without
        gaps (one per time index, right-aligned), so the group is found by column; the
        candidate is EMPTY unless the group is complete, inside one episode and aligned.
        """
        batch, length = recent.position.shape
        queries = call.num_queries
        first = call.positions - self.max_span  # (B, Q)
        # episode begin of every recent memory: the memory's (before the call) or the query's
        begin = torch.cat(
            [call.memory_begin[:, None].expand(batch, length - queries), call.query_begin], 1
        )
        # the columns of times start - L .. start - L + Q + c - 2, padded with empty slots in
        # front while the memory is shorter
        width = queries + self.rate - 1
        start = length - queries - self.max_span
        columns = slice(max(start, 0), max(start + width, 0))
        missing = width - (columns.stop - columns.start)
        hidden = F.pad(recent.hidden[:, columns], (0, 0, missing, 0))
        position = F.pad(recent.position[:, columns], (missing, 0), value=EMPTY)
        begin = F.pad(begin[:, columns], (missing, 0))
        last = self.rate - 1
        first_begin = begin[:, :queries]
        valid = (
            (position[:, :queries] == first)
            & (position[:, last:] == first + last)
            & (begin[:, last:] == first_begin)
            & (first >= first_begin)
            & (torch.remainder(first - first_begin, self.rate) == 0)
        )
        pooled = mean_pool(hidden, self.rate)
        keys, values = attention.key_value(pooled)
        return Slots(pooled, keys, values, torch.where(valid, first, EMPTY), None)
