"""What the agent asks of its core (`Core`): the memory transformer (`memory.MemoryTransformer`)
and the baselines (`agents.RecurrentCore`, `agents.FeedForwardCore`) all provide it, so the
actor-critic, the player and the learner hold any of them alike."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from memory import CoreOutput

# A core's state is its own (`memory.MemoryState`, `agents.recurrent.RecurrentState`): only
# the core makes, refreshes, saves and loads it; the learner selects minibatches from it.
State = Any


@runtime_checkable
class Core(Protocol):
    """A core (an `nn.Module`): step mode to act, block mode to learn over an unroll from the
    memory carried before it, and that memory's life across updates and checkpoints."""

    # Whether a step without gradients writes into the memory's buffers, the step
    # `agents.compiled_step` compiles (a memory transformer's plan_step and planned_output)
    steps_in_buffers: bool
    # Whether its memory has a span penalty (memory.aux_loss_coef) and an attended pull
    # (memory.attended_span_coef) whose weights a learner may change (agent.held_*)
    penalises_span: bool
    pulls_attended: bool

    def initial_state(self, batch_size: int, device: torch.device | str = ...) -> State:
        """An empty memory for ``batch_size`` sequences."""

    def forward(
        self,
        x: torch.Tensor,
        state: State,
        episode_start: torch.Tensor | None = None,
        next_state: bool = True,
    ) -> CoreOutput:
        """Block mode: x (B, K, dim), episode_start (B, K); without ``next_state`` the
        output's state is None."""

    def step(
        self, x: torch.Tensor, state: State, episode_start: torch.Tensor | None = None
    ) -> CoreOutput:
        """Step mode: x (B, dim), episode_start (B,)."""

    def refresh(self, state: State) -> State:
        """``state`` as the current weights read it (after an update)."""

    def save_state(self, state: State) -> dict:
        """``state`` for a checkpoint, as tensors and plain values."""

    def load_state(self, saved: dict, device: torch.device | str) -> State:
        """The state `save_state` saved, on ``device``."""
