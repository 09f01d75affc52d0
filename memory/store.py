"""Memory store: the memories of one layer and their deletion (the state of the whole core,
made of them, is `memory.state`).

Layout of one layer's memory for a batch of B sequences (``Slots``): slot ``j`` of element
``b`` holds one memory h_i, i.e. the layer-normed input of the layer at time index
``position[b, j]``, together with its cached key and value (and, for Expire-Span, its
expire-span e_i). Keys are stored transposed, (B, H, head_dim, N), because q @ K is then a
plain batched matrix product, noticeably faster on CPU for small head dimensions. Per
element the filled slots are sorted by time; empty slots have position -1 and sit in front
of them. So the memory of every element ends in the last
column, which keeps the relative-position window (A.1) at the end of the tensor.

Deleting memories (section 4.2, "Block Parallel") is *compaction*: each element keeps its
surviving slots in order, right-aligned, and the stored length becomes the largest number
of survivors in the batch. Compute and storage therefore follow the memories that are
still alive, not the maximum span L. A call from a state of fixed shapes (a compiled
step's, `MemoryState.fixed_shapes`) empties the dead slots instead and keeps its shapes;
`MemoryState.compacted` then deletes them in every store, reading all new lengths from the
device at once.

Step mode appends one slot per step into spare capacity instead of re-allocating the
memory, and compacts only when the spare capacity runs out; slots that died in between
stay in place but are masked, which changes no output. Spare slots hold an empty memory
(position -1, zeros), so a step may attend over the whole buffer: its shapes then change
only at a compaction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

EMPTY = -1  # position of an empty slot
SLOT_AXES = (1, 3, 2, 1, 1)  # the slot axis of each field of Slots
EMPTY_SLOT = (0, 0, 0, EMPTY, 0)  # what each field of Slots holds in an empty slot
MIN_SPARE_SLOTS = 32  # step mode: spare capacity left after a compaction, at least
# A step's memory in the shapes the step computes it: h_i (B, dim), the key as the query,
# (B, H, 1, head_dim), not transposed, the value (B, H, 1, head_dim), position and span (B, 1).
# Per field of Slots: a buffer's field split into its slots in these shapes (`SlotStore.slot`),
# and a step's field as one slot of the buffer's (`write_slot`'s indexed write).
STEP_SLOT = (
    (lambda t: t.unbind(1), lambda t: t[:, None]),
    (lambda t: t.mT.split(1, 2), lambda t: t.mT),
    (lambda t: t.split(1, 2), lambda t: t),
    (lambda t: t.split(1, 1), lambda t: t),
    (lambda t: t.split(1, 1), lambda t: t),
)


class Slots(NamedTuple):
    """Memories of one layer for a batch (tensors may be views into a larger buffer)."""

    hidden: Tensor  # (B, N, dim)   the memories h_i (layer-normed layer inputs)
    keys: Tensor  # (B, H, head_dim, N)   cached W_k h_i, transposed
    values: Tensor  # (B, H, N, head_dim)   cached W_v h_i
    position: Tensor  # (B, N) int64   time index i of each memory, EMPTY for an empty slot
    span: Tensor | None  # (B, N)   expire-span e_i (Expire-Span only)

    @property
    def length(self) -> int:
        return self.position.shape[1]

    def cat(self, other: Slots) -> Slots:
        return Slots(
            *(
                None if a is None else torch.cat([a, b], axis)
                for a, b, axis in zip(self, other, SLOT_AXES, strict=True)
            )
        )

    def narrow(self, start: int, length: int) -> Slots:
        return Slots(
            *(
                None if t is None else t.narrow(axis, start, length)
                for t, axis in zip(self, SLOT_AXES, strict=True)
            )
        )

    def detach(self) -> Slots:
        return Slots(*(None if t is None else t.detach() for t in self))

    def survivors(self, alive: Tensor) -> Slots:
        """Delete the slots where ``alive`` (B, N) is False: compact each element's survivors."""
        return compacted(self, alive)[0]


class SlotStore:
    """One layer's memory: slots ``[0, length)`` of a buffer that may have spare capacity.

    Snapshots of the state share buffers. A step writes in place only when its snapshot is
    the newest one of the buffer (no other snapshot has written past ``length``); otherwise
    the buffer is copied first. So a state kept aside, e.g. by a learner at the start of an
    unroll, stays valid while acting continues from it.
    """

    __slots__ = ("buffer", "length", "_written", "_slots")

    def __init__(
        self,
        buffer: Slots,
        length: int,
        written: list[int] | None = None,
        slots: list[list[tuple[Tensor, ...]] | None] | None = None,
    ) -> None:
        self.buffer = buffer
        self.length = length
        self._written = [length] if written is None else written  # shared by snapshots
        self._slots = [None] if slots is None else slots  # (`slot`; shared too)

    @classmethod
    def empty(cls, batch: int, dim: int, heads: int, with_span: bool, device, dtype) -> SlotStore:
        head_dim = dim // heads
        return cls.of(
            Slots(
                torch.zeros(batch, 0, dim, device=device, dtype=dtype),
                torch.zeros(batch, heads, head_dim, 0, device=device, dtype=dtype),
                torch.zeros(batch, heads, 0, head_dim, device=device, dtype=dtype),
                torch.zeros(batch, 0, dtype=torch.long, device=device),
                torch.zeros(batch, 0, device=device, dtype=dtype) if with_span else None,
            )
        )

    @classmethod
    def of(cls, slots: Slots, spare: int = 0) -> SlotStore:
        """A store owning its own copy of ``slots``, with room for ``spare`` more."""
        buffer = []
        for t, axis, empty in zip(slots, SLOT_AXES, EMPTY_SLOT, strict=True):
            if t is not None and (spare or not _owns_storage(t)):
                shape = list(t.shape)
                shape[axis] += spare
                grown = t.new_empty(shape)
                grown.narrow(axis, 0, t.shape[axis]).copy_(t)
                grown.narrow(axis, t.shape[axis], spare).fill_(empty)
                t = grown
            buffer.append(t)
        return cls(Slots(*buffer), slots.length)

    @property
    def capacity(self) -> int:
        return self.buffer.position.shape[1]

    def view(self) -> Slots:
        if self.length == self.capacity:  # (no views to make)
            return self.buffer
        return self.buffer.narrow(0, self.length)

    def slot(self, index: int) -> list[Tensor]:
        """Views of slot ``index`` in every field of the buffer, shaped as a step's memory is
        (`STEP_SLOT`), for one copy into all of them (`write_slot`); each field is split into
        its slots once a buffer."""
        if self._slots[0] is None:
            fields = zip(self.buffer, STEP_SLOT, strict=True)
            self._slots[0] = [split(t) for t, (split, _) in fields if t is not None]
        return [slots[index] for slots in self._slots[0]]

    def can_append(self, n: int) -> bool:
        # a buffer made under torch.inference_mode can be written only there
        writable = torch.is_inference_mode_enabled() or not self.buffer.position.is_inference()
        return writable and self._written[0] == self.length and self.length + n <= self.capacity

    def with_room(self, n: int, alive: Callable[[Slots], Tensor]) -> SlotStore:
        """This store if ``n`` slots can be appended in place, else its slots that are
        ``alive`` (a function of the slots, (B, N) bool) in a new buffer with room for them."""
        if self.can_append(n):
            return self
        view = self.view()
        return SlotStore(
            *compacted(view, alive(view), lambda kept: max(n, MIN_SPARE_SLOTS, kept // 2))
        )

    def selected(self, index: Tensor | slice, filled: Filled | None = None) -> SlotStore:
        """The slots of the batch elements ``index`` without the empty ones, compacted; with
        what is known of how they fill the store (``filled``), without reading anything back
        from the device: where each one's filled slots are its last ones, the store's last
        ``filled.length`` slots."""
        if filled is not None and not filled.gaps:
            last = self.buffer.narrow(self.length - filled.length, filled.length)
            return SlotStore.of(Slots(*(None if t is None else t[index] for t in last)))
        slots = Slots(*(None if t is None else t[index] for t in self.view()))
        length = None if filled is None else filled.length
        return SlotStore.of(compacted(slots, slots.position != EMPTY, length=length)[0])

    def filled(self) -> Tensor:
        """(2, B): how many slots each batch element fills, and how many empty slots sit
        between its filled ones (none where compaction and appending keep them its last
        slots; Compressive's candidates are empty where no group was due)."""
        filled = self.buffer.position.narrow(1, 0, self.length) != EMPTY
        count = filled.sum(1)
        return torch.stack([count, (filled.cumsum(1) > 0).sum(1) - count])

    def padded(self, index: Tensor | slice, length: int) -> SlotStore:
        """The slots of the batch elements ``index`` in a new buffer of ``length`` slots, with
        empty slots in front: nothing is compacted, so no length is read back from the device."""
        slots = self.view()
        front = length - slots.length
        fields = []
        for t, axis, empty in zip(slots, SLOT_AXES, EMPTY_SLOT, strict=True):
            if t is not None:
                after = [0, 0] * (t.dim() - 1 - axis)  # (F.pad lists the last axis first)
                t = F.pad(t[index], [*after, front, 0], value=empty)
            fields.append(t)
        return SlotStore(Slots(*fields), length)

    def appended(self, new: Slots) -> SlotStore:
        """Write ``new`` after the last slot, in place (requires ``can_append``)."""
        for target, source, axis in zip(self.buffer, new, SLOT_AXES, strict=True):
            if target is not None:
                target.narrow(axis, self.length, new.length).copy_(source)
        return self.grown(new.length)

    def grown(self, n: int) -> SlotStore:
        """The store with ``n`` more slots, already written into its buffer after the last."""
        self._written[0] = self.length + n
        return SlotStore(self.buffer, self.length + n, self._written, self._slots)


class Filled(NamedTuple):
    """How the batch elements of a selection fill a store (`SlotStore.filled`)."""

    length: int  # the most slots one of them fills
    gaps: bool  # whether empty slots sit between one's filled ones


def padded_length(length: int) -> int:
    """The least power of two, at least 8, that holds ``length`` slots: stores padded to it
    take few lengths (a run's memories shrinking from 200 slots to 20 see five), each at
    most half empty."""
    return max(8, 1 << max(length - 1, 0).bit_length())


def write_slot(buffer: Slots, slot: Sequence[Tensor] | Tensor, new: Slots) -> None:
    """Write a step's memory ``new`` (`STEP_SLOT`'s shapes) into a slot of ``buffer``, in
    place: into the slot's views (`SlotStore.slot`), all fields in one operation and with no
    index to copy to a GPU (which would wait for it), or into slot ``slot`` given as a 0-d
    tensor (a compiled step's) by an indexed write of the whole buffer, which a compiled step
    does in place."""
    if not isinstance(slot, Tensor):
        torch._foreach_copy_(list(slot), [t for t in new if t is not None])
        return
    for target, source, axis, (_, one_slot) in zip(buffer, new, SLOT_AXES, STEP_SLOT, strict=True):
        if target is not None:
            target.index_copy_(axis, slot.reshape(1), one_slot(source))


def compacted(
    slots: Slots,
    alive: Tensor,
    spare: Callable[[int], int] = lambda kept: 0,
    length: int | None = None,
) -> tuple[Slots, int]:
    """``slots`` without those where ``alive`` (B, N) is False, each element's survivors in
    order and right-aligned (empty slots in front where it kept fewer than the most), followed
    by ``spare(length)`` empty slots in the same new buffer; and ``length``, the slots kept:
    the most survivors of an element, read from the device unless the caller knows it.
    Without spare slots, survivors that form a common suffix are a slice of ``slots`` (checked
    where the length is read)."""
    count = alive.sum(1)
    known = length is not None
    if not known:
        length = int(count.max()) if slots.length else 0
    room = spare(length)
    start = slots.length - length
    if not known and not room and bool(alive[:, start:].all()):
        return slots.narrow(start, length), length
    order = torch.sort(alive.to(torch.uint8), dim=1, stable=True).indices[:, start:]
    index = torch.nn.functional.pad(order, (0, room))  # (spare slots: emptied below)
    slot = torch.arange(length + room, device=alive.device)
    kept = (slot >= (length - count)[:, None]) & (slot < length)
    fields = [
        None if t is None else _select_slots(t, axis, index)
        for t, axis in zip(slots, SLOT_AXES, strict=True)
    ]
    for t, axis, empty in zip(fields, SLOT_AXES, EMPTY_SLOT, strict=True):
        if t is not None and room:
            t.narrow(axis, length, room).fill_(empty)
    survivors = Slots(*fields)
    survivors.position.masked_fill_(~kept, EMPTY)
    return survivors, length


def _select_slots(t: Tensor, axis: int, index: Tensor) -> Tensor:
    """The slots ``index`` (B, M) of each batch element of ``t`` along ``axis``. Where whole
    rows follow the slot axis, an index_select of those rows: on a CPU about 5 times faster
    than a gather with an expanded index."""
    row = t.shape[axis + 1 :]
    if t.shape[axis] == 0:  # nothing to select: all ``index`` are spare slots
        return t.new_empty(*t.shape[:axis], index.shape[1], *row)
    if not row:
        return t.gather(
            axis, index.view(index.shape[0], *[1] * (axis - 1), -1).expand(*t.shape[:axis], -1)
        )
    middle = math.prod(t.shape[1:axis])
    base = torch.arange(t.shape[0] * middle, device=index.device).view(-1, middle, 1)
    rows = (base * t.shape[axis] + index[:, None, :]).flatten()
    picked = t.reshape(-1, math.prod(row)).index_select(0, rows)
    return picked.view(*t.shape[:axis], index.shape[1], *row)


def _owns_storage(t: Tensor) -> bool:
    """True if ``t`` is contiguous and not a view keeping a larger tensor alive."""
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()
