"""The language model: token embedding, the memory transformer core, a read-out to the vocabulary.

The same `memory.MemoryTransformer` that the RL agents use; here it reads one block of K
tokens per call and carries its memory (detached) from block to block, so a model sees
further back than its block, as far as its memory kind keeps things.

`memory_state_dict` / `load_memory_state` turn that carried memory into tensors and plain
values and back, so a checkpoint can hold it and a resumed run continues exactly.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from memory import CoreOutput, MemoryConfig, MemoryState, MemoryTransformer, Slots, SlotStore


class LanguageModel(nn.Module):
    """Next-token model: logits (B, K, V) for tokens (B, K) given the memory of earlier blocks."""

    def __init__(self, vocab_size: int, cfg: MemoryConfig) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, cfg.dim)
        self.core = MemoryTransformer(cfg)
        self.head = nn.Linear(cfg.dim, vocab_size)

    @property
    def cfg(self) -> MemoryConfig:
        return self.core.cfg

    def initial_state(self, batch_size: int, device: torch.device | str | None = None):
        """An empty memory for `batch_size` streams."""
        return self.core.initial_state(batch_size, device)

    def forward(self, tokens: Tensor, state: MemoryState) -> tuple[Tensor, CoreOutput]:
        """tokens (B, K) int64 -> logits (B, K, V) and the core's output (new state, aux loss)."""
        out = self.core(self.embedding(tokens), state)
        return self.head(out.hidden), out


def memory_state_dict(state: MemoryState) -> dict[str, Any]:
    """The carried memory as tensors and plain values (for `torch.load(weights_only=True)`)."""

    def slots(store: SlotStore) -> list[Tensor | None]:
        # clone: a view would save its whole (larger) buffer
        return [None if t is None else t.detach().cpu().clone() for t in store.view()]

    return {
        "time": state.time,
        "episode_begin": state.episode_begin.cpu().clone(),
        "layers": [slots(store) for store in state.layers],
        "compressed": None if state.compressed is None else [slots(s) for s in state.compressed],
    }


def load_memory_state(saved: dict[str, Any], device: torch.device | str) -> MemoryState:
    """The memory saved by `memory_state_dict`, on `device`."""

    def store(tensors: list[Tensor | None]) -> SlotStore:
        return SlotStore.of(Slots(*(None if t is None else t.to(device) for t in tensors)))

    compressed = saved["compressed"]
    return MemoryState(
        time=saved["time"],
        episode_begin=saved["episode_begin"].to(device),
        layers=tuple(store(t) for t in saved["layers"]),
        compressed=None if compressed is None else tuple(store(t) for t in compressed),
    )
