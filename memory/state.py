"""The state of the whole core between calls (`MemoryState`): per layer, its memory as named
parts (`LayerMemory`) that its memory kind defines, the stores among them laid out as
`memory.store` describes; and how the state is selected for minibatches, saved and loaded."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from memory.store import EMPTY, Filled, Slots, SlotStore, compacted, padded_length

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
