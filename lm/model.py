"""The language model: token embedding, the memory transformer core, a read-out to the vocabulary.

The same `memory.MemoryTransformer` that the RL agents use; here it reads one block of K
tokens per call and carries its memory (detached) from block to block, so a model sees
further back than its block, as far as its memory kind keeps things.

`MemoryState.state_dict` / `MemoryState.from_state_dict` turn that carried memory into tensors
and plain values and back, so a checkpoint can hold it and a resumed run continues exactly.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from memory import CoreOutput, MemoryConfig, MemoryState, MemoryTransformer
from training import load_checkpoint


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


def load_trained(checkpoint_path: str | Path) -> tuple[LanguageModel, dict, list[str]] | None:
    """The trained model (eval mode), its run config and vocabulary from a checkpoint file or
    run directory of train_lm.py; None when there is no checkpoint there."""
    checkpoint = load_checkpoint(checkpoint_path)
    if checkpoint is None:
        return None
    config, vocab = checkpoint["config"], checkpoint["vocab"]
    model = LanguageModel(len(vocab), MemoryConfig(**config["memory"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval(), config, vocab
