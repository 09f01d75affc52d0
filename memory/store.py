"""Memory store: the memories of one layer, their deletion, and the state of the whole core.

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

EMPTY = -1  # position of an empty slot
SLOT_AXES = (1, 3, 2, 1, 1)  # the slot axis of each field of Slots
EMPTY_SLOT = (0, 0, 0, EMPTY, 0)  # what each field of Slots holds in an empty slot
MIN_SPARE_SLOTS = 32  # step mode: spare capacity left after a compaction, at least


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
        """Views of slot ``index`` in every field of the buffer, for one copy into all of them
        (`write_slot`); each field is split into its slots once a buffer."""
        if self._slots[0] is None:
            fields = zip(self.buffer, SLOT_AXES, strict=True)
            self._slots[0] = [t.split(1, axis) for t, axis in fields if t is not None]
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
    """Write the one-slot ``new`` into a slot of ``buffer``, in place: into the slot's views
    (`SlotStore.slot`), all fields in one operation and with no index to copy to a GPU (which
    would wait for it), or into slot ``slot`` given as a 0-d tensor (a compiled step's) by an
    indexed write of the whole buffer, which a compiled step does in place."""
    if not isinstance(slot, Tensor):
        torch._foreach_copy_(list(slot), [t for t in new if t is not None])
        return
    for target, source, axis in zip(buffer, new, SLOT_AXES, strict=True):
        if target is not None:
            target.index_copy_(axis, slot.reshape(1), source)


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


Part = SlotStore | Tensor
Cached = Callable[[Tensor, Tensor, bool], Slots]  # (hidden, position, with_span) -> the slots


class LayerMemory:
    """One layer's memory between calls, as named parts its memory kind defines.

    Every kind keeps ``recent``, the store of the layer's recent hidden states; a kind may add
    parts of its own (more stores, e.g. compressed memories; per-sequence tensors of shape
    (B, ...)). Shared code selects, saves and measures a layer's memory
    through this class without knowing which parts its kind keeps.
    """

    __slots__ = ("parts",)

    def __init__(self, **parts: Part) -> None:
        self.parts = parts

    def __getitem__(self, name: str) -> Part:
        return self.parts[name]

    def get(self, name: str) -> Part | None:
        return self.parts.get(name)

    def replace(self, **parts: Part) -> LayerMemory:
        """The same memory with the parts given replaced."""
        return LayerMemory(**{**self.parts, **parts})

    def stores(self) -> list[SlotStore]:
        return [part for part in self.parts.values() if isinstance(part, SlotStore)]

    def filled(self) -> dict[str, Tensor]:
        """Per store, how each batch element fills it (`SlotStore.filled`), (2, B)."""
        return {
            name: part.filled() for name, part in self.parts.items() if isinstance(part, SlotStore)
        }

    def select(
        self,
        index: Tensor | slice,
        lengths: Mapping[str, int] | None = None,
        filled: Mapping[str, Filled] | None = None,
    ) -> LayerMemory:
        """The memories of the batch elements ``index``, each store compacted (knowing how
        they fill it where ``filled`` says, `SlotStore.selected`); with ``lengths``, padded
        to the length given for its part instead (`SlotStore.padded`)."""

        def pick(name: str, part: Part) -> Part:
            if isinstance(part, SlotStore) and lengths is not None:
                return part.padded(index, lengths[name])
            if isinstance(part, SlotStore):
                return part.selected(index, None if filled is None else filled[name])
            return part[index]

        return LayerMemory(**{name: pick(name, part) for name, part in self.parts.items()})

    def state_dict(
        self, needed: Mapping[str, Tensor] | None = None
    ) -> dict[str, dict[str, Tensor | bool] | Tensor]:
        """The parts as tensors. A store keeps every slot's position and the h_i of the slots
        ``needed[name]`` (B, N) marks (by default, its filled slots), as rows (N_kept, dim):
        the keys, values and spans cached from them, two thirds of its bytes, are left out,
        and ``from_state_dict`` recomputes them."""
        needed = needed or {}

        def save(name: str, part: Part) -> dict[str, Tensor | bool] | Tensor:
            if isinstance(part, SlotStore):
                slots = part.view()
                kept = needed.get(name, slots.position != EMPTY)
                return {
                    "hidden": slots.hidden[kept].detach().cpu(),
                    "kept": kept.cpu(),
                    "position": slots.position.cpu().clone(),  # (clone: not the whole buffer)
                    "with_span": slots.span is not None,
                }
            return part.cpu()

        return {name: save(name, part) for name, part in self.parts.items()}

    @classmethod
    def from_state_dict(
        cls, saved: dict, device: torch.device | str, cached: Cached
    ) -> LayerMemory:
        """The memory `state_dict` saved, on ``device``, zeros for the h_i left out; ``cached``
        computes each store's keys, values and spans from its h_i (``MemoryKind.cached`` with
        this layer's attention)."""

        def load(part: dict | list | Tensor) -> Part:
            if isinstance(part, list):  # an older checkpoint's store: its five slot fields
                hidden, position, with_span = part[0].to(device), part[3].to(device), part[4]
                return SlotStore.of(cached(hidden, position, with_span is not None))
            if isinstance(part, dict):
                position, rows = part["position"].to(device), part["hidden"].to(device)
                hidden = rows.new_zeros(*position.shape, rows.shape[-1])
                hidden[part["kept"].to(device)] = rows
                return SlotStore.of(cached(hidden, position, part["with_span"]))
            return part.to(device)

        return cls(**{name: load(part) for name, part in saved.items()})


@dataclass
class MemoryState:
    """Everything the core carries from one call to the next, detached from autograd.

    ``time`` is the time index of the next step (all elements of the batch advance
    together; it starts at 0). ``episode_begin[b]`` is the time index at which element b's
    current episode began: memories before it are invisible and get deleted. ``layers[l]``
    is layer l's memory (``LayerMemory``), whose parts its memory kind defines.
    """

    time: int | Tensor  # (a 0-d int64 tensor in a state of fixed shapes, see ``select``)
    episode_begin: Tensor  # (B,) int64
    layers: tuple[LayerMemory, ...]

    @property
    def batch_size(self) -> int:
        return self.episode_begin.shape[0]

    @property
    def device(self) -> torch.device:
        return self.episode_begin.device

    @property
    def fixed_shapes(self) -> bool:
        """Whether this is a state of fixed shapes (`select`, `compacted`): a call of the core
        from it keeps every slot of its memory, emptying those that die, for `compacted` to
        delete, so that the call's shapes follow the stores' padded lengths only."""
        return isinstance(self.time, Tensor)

    def compacted(self) -> MemoryState:
        """The state of fixed shapes that keeps this one's memories: every store without its
        empty slots (those a call of fixed shapes emptied), then padded as `select` with
        ``fixed_shapes`` pads it. The stores' new lengths are read from the device at once."""
        stores = [store.view() for layer in self.layers for store in layer.stores()]
        counts = [(slots.position != EMPTY).sum(1).amax() for slots in stores]
        lengths = iter(torch.stack(counts).tolist() if counts else [])  # the one read
        layers = []
        for layer in self.layers:
            parts = {}
            for name, part in layer.parts.items():
                if isinstance(part, SlotStore):
                    slots = part.view()
                    kept, length = compacted(slots, slots.position != EMPTY, length=next(lengths))
                    part = SlotStore(kept, length)
                parts[name] = part
            layers.append(LayerMemory(**parts))
        state = MemoryState(self.time, self.episode_begin, tuple(layers))
        return state.select(slice(None), fixed_shapes=True)

    def select(self, index: Tensor | slice, fixed_shapes: bool = False) -> MemoryState:
        """The memories of the batch elements ``index`` (e.g. a minibatch of environments).
        With ``fixed_shapes`` (for a compiled learner), every store keeps all its slots,
        padded in front with empty slots to the `padded_length` of the longest store of its
        part over the layers, and ``time`` is a tensor: from one update to the next a
        compiled call then sees few shapes and no new constant, and selecting waits for
        nothing on a GPU. The outputs are those of the compacted memory up to float rounding
        (empty slots weigh exactly 0, but sums run over more terms)."""
        lengths = None
        if fixed_shapes:
            lengths = {}
            for layer in self.layers:
                for name, part in layer.parts.items():
                    if isinstance(part, SlotStore):
                        lengths[name] = max(lengths.get(name, 0), padded_length(part.length))
        layers = tuple(layer.select(index, lengths) for layer in self.layers)
        time = torch.as_tensor(self.time, device=self.device) if fixed_shapes else self.time
        return MemoryState(time, self.episode_begin[index], layers)

    @cached_property
    def filled(self) -> tuple[list[dict[str, Tensor]], Tensor]:
        """How the batch elements fill each store of each layer (`SlotStore.filled`), and all
        of it as one tensor (2 x stores, B): what `minibatches` selects by, made once (a
        learner selects from one state every epoch)."""
        filled = [layer.filled() for layer in self.layers]
        return filled, torch.cat([part for parts in filled for part in parts.values()])

    def minibatches(self, indices: Sequence[Tensor]) -> list[MemoryState]:
        """The memories of each set of batch elements in ``indices`` (a learner's minibatches),
        as `select` compacts them, with how they fill every store read from the device at
        once: a minibatch then waits for nothing on a GPU."""
        filled, stores = self.filled
        read = torch.stack([stores[:, index].amax(1) for index in indices]).tolist()  # the one
        selected = []
        for index, most in zip(indices, read, strict=True):
            most = iter(most)  # per store: the most slots filled, the most empty ones between
            layers = tuple(
                layer.select(
                    index, filled={name: Filled(next(most), next(most) > 0) for name in parts}
                )
                for layer, parts in zip(self.layers, filled, strict=True)
            )
            selected.append(MemoryState(self.time, self.episode_begin[index], layers))
        return selected

    def state_dict(self, needed: Sequence[Mapping[str, Tensor]] | None = None) -> dict:
        """The memory as tensors and plain values, for `torch.load(weights_only=True)`;
        ``needed[l]``: the slots of layer l whose h_i to keep (``LayerMemory.state_dict``)."""
        needed = needed or [{}] * len(self.layers)
        return {
            "time": int(self.time),
            "episode_begin": self.episode_begin.cpu().clone(),
            "layers": [
                layer.state_dict(kept) for layer, kept in zip(self.layers, needed, strict=True)
            ],
        }

    @classmethod
    def from_state_dict(
        cls, saved: dict, device: torch.device | str, cached: Sequence[Cached]
    ) -> MemoryState:
        """The memory `state_dict` saved, on ``device``, ``cached[l]`` computing layer l's
        keys, values and spans (`memory.MemoryTransformer.load_state` passes them)."""
        layers = zip(saved["layers"], cached, strict=True)
        return cls(
            time=saved["time"],
            episode_begin=saved["episode_begin"].to(device),
            layers=tuple(LayerMemory.from_state_dict(layer, device, c) for layer, c in layers),
        )

    def stored_lengths(self) -> list[int]:
        """Slots stored per layer, in all its stores: the memory's footprint."""
        return [sum(store.length for store in layer.stores()) for layer in self.layers]
