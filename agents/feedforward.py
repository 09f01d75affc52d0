"""A core without memory: POPGym's MLP baseline, what an agent does with the current step's
input alone (and the previous action and reward, where the env gives them)."""

from __future__ import annotations

import torch
from torch import nn

from agents.recurrent import RecurrentState
from memory import CoreOutput

FEEDFORWARD_KIND = "mlp"


class FeedForwardCore(nn.Module):
    """Two linear layers with a ReLU between them, then a layer norm, in the memory cores'
    interface (`memory.MemoryTransformer`, `agents.RecurrentCore`). The state it carries is
    an empty `RecurrentState`, so acting, learning and checkpoints treat it as any core's;
    `memory_size` is 0."""

    steps_in_buffers = False  # (`agents.core.Core`: no buffers to compile a step over)
    penalises_span = pulls_attended = False  # (no span penalty, no attended pull)

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.layers = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))
        self.norm = nn.LayerNorm(dim)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        """No layers of state: h is (0, batch_size, dim)."""
        return RecurrentState(torch.zeros(0, batch_size, self.dim, device=device))

    def refresh(self, state: RecurrentState) -> RecurrentState:
        return state

    def save_state(self, state: RecurrentState) -> dict[str, torch.Tensor]:
        return state.state_dict()

    def load_state(self, saved: dict, device: torch.device | str) -> RecurrentState:
        return RecurrentState.from_state_dict(saved, device)

    def forward(
        self,
        x: torch.Tensor,
        state: RecurrentState,
        episode_start: torch.Tensor | None = None,
        next_state: bool = True,
    ) -> CoreOutput:
        """Block mode (x (B, K, dim)) and step mode (x (B, dim)) alike: each step alone."""
        return CoreOutput(
            self.norm(self.layers(x)), state if next_state else None, x.new_zeros(()), 0.0
        )

    step = forward
