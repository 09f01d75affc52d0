"""The language model: token embedding, the memory transformer core, a read-out to the vocabulary.

The same `memory.MemoryTransformer` that the RL agents use; here it reads one block of K
tokens per call and carries its memory (detached) from block to block, so a model sees
further back than its block, as far as its memory kind keeps things.

`MemoryState.state_dict` / `MemoryTransformer.load_state` turn that carried memory into tensors
and plain values and back, so a checkpoint can hold it and a resumed run continues exactly.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from memory import CoreOutput, MemoryConfig, MemoryState, MemoryTransformer


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


def trained_model(checkpoint: dict) -> LanguageModel:
    """The model a train_lm.py checkpoint holds (`training.checkpoint.load_checkpoint`), in
    eval mode."""
    model = LanguageModel(len(checkpoint["vocab"]), MemoryConfig(**checkpoint["config"]["memory"]))
    model.load_state_dict(checkpoint["model"])
    return model.eval()


@torch.no_grad()
def greedy_predictions(model: LanguageModel, inputs: np.ndarray) -> np.ndarray:
    """The most likely next token at every position of `inputs` (rows, length), each row read
    from an empty memory in blocks of K as evaluation reads it; for analyses of a model."""
    tokens = torch.from_numpy(inputs.astype(np.int64))
    state, predictions = model.initial_state(len(tokens)), []
    for start in range(0, tokens.shape[1], model.cfg.block_len):
        logits, out = model(tokens[:, start : start + model.cfg.block_len], state)
        state = out.state
        predictions.append(logits.argmax(-1))
    return torch.cat(predictions, dim=1).numpy()
