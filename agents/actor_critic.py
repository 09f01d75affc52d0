"""The actor-critic agent: word-window encoder, a memory core, policy and value heads."""

from __future__ import annotations

import math

import torch
from torch import nn

from memory import CoreOutput


class ActorCritic(nn.Module):
    """Acts in step mode (one timestep for a batch of environments) and is trained in
    block mode (a whole unroll at once, from the memory carried over from the previous
    unroll). `core` is a `memory.MemoryTransformer` or an `agents.LSTMCore`.

    The encoder is one linear map of the flattened multi-hot window: each (cell, word)
    pair gets its own embedding, summed over the words present, as in MazeBase models.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, core: nn.Module, dim: int):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(math.prod(obs_shape), dim), nn.ReLU())
        self.core = core
        self.policy = nn.Linear(dim, num_actions)
        self.value = nn.Linear(dim, 1)
        nn.init.orthogonal_(self.policy.weight, gain=0.01)
        nn.init.zeros_(self.policy.bias)
        nn.init.orthogonal_(self.value.weight, gain=1.0)
        nn.init.zeros_(self.value.bias)
        self.obs_dims = len(obs_shape)

    def initial_state(
        self, batch_size: int, device: torch.device | str = "cpu", explore: bool = False
    ):
        """The core's empty state; ``explore``: the state of an agent that learns as it acts
        (Expire-Span's exploring spans, ``memory.span_noise``)."""
        return self.core.initial_state(batch_size, device, explore)

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(obs.flatten(start_dim=-self.obs_dims).float())

    def forward(
        self,
        obs: torch.Tensor,
        state,
        episode_start: torch.Tensor,
        span_credit: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, CoreOutput]:
        """Block mode: obs (B, T, *obs_shape), episode_start (B, T) ->
        logits (B, T, A), values (B, T) and the core's output. ``span_credit`` (B, T): the
        return credited to each step's memories (exploring spans)."""
        out = self.core(self.encode(obs), state, episode_start, span_credit)
        return self.policy(out.hidden), self.value(out.hidden).squeeze(-1), out

    @torch.no_grad()
    def act(
        self, obs: torch.Tensor, state, episode_start: torch.Tensor, greedy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CoreOutput]:
        """Step mode: obs (B, *obs_shape), episode_start (B,) -> action, its log-probability,
        the value estimate and the core's output (whose `state` is the next state)."""
        out = self.core.step(self.encode(obs), state, episode_start)
        logits = self.policy(out.hidden)
        log_probs = torch.log_softmax(logits, dim=-1)
        if greedy:
            action = logits.argmax(dim=-1)
        else:  # Gumbel-max sampling: cheaper than torch.multinomial for small batches.
            gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_(min=1e-20)))
            action = (log_probs + gumbel).argmax(dim=-1)
        log_prob = log_probs.gather(-1, action[:, None]).squeeze(-1)
        return action, log_prob, self.value(out.hidden).squeeze(-1), out
