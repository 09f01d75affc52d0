"""The actor-critic agent: observation encoder, a memory core, policy and value heads."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from agents.encoders import make_encoder
from agents.learners import Logits, log_prob_and_entropy
from memory import CoreOutput

# What the agent saw besides the observation: the previous action and the previous reward,
# (B,) or (B, T) (MultiDiscrete actions: (..., components)), taken as zeros at episode starts.
Previous = tuple[torch.Tensor, torch.Tensor]


def action_sizes(space: spaces.Space) -> tuple[int, ...]:
    """The number of choices of each component of a Discrete (one) or MultiDiscrete action
    space; a ValueError for any other space."""
    if isinstance(space, spaces.Discrete) and space.start == 0:
        return (int(space.n),)
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1 and not space.start.any():
        return tuple(int(n) for n in space.nvec)
    raise ValueError(
        f"action space {space} is not supported: the agent's policy is categorical, for "
        "Discrete or one-dimensional MultiDiscrete actions starting at 0 (a Box action space "
        "needs a continuous policy; discretise it with a wrapper)"
    )


class MultiHead(nn.Module):
    """Independent categorical heads, one Linear per component of a MultiDiscrete action."""

    def __init__(self, dim: int, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(dim, size) for size in sizes)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(head(hidden) for head in self.heads)


def sample(logits: Logits, greedy: bool = False) -> torch.Tensor:
    """An action of each batch element: the most likely (``greedy``) or a sample; one per
    component for MultiDiscrete logits, stacked on the last dimension."""
    if isinstance(logits, tuple):
        return torch.stack([sample(part, greedy) for part in logits], dim=-1)
    if greedy:
        return logits.argmax(dim=-1)
    # Gumbel-max sampling: cheaper than torch.multinomial for small batches.
    gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_(min=1e-20)))
    return (torch.log_softmax(logits, dim=-1) + gumbel).argmax(dim=-1)


class ActorCritic(nn.Module):
    """Acts in step mode (one timestep for a batch of environments) and is trained in
    block mode (a whole unroll at once, from the memory carried over from the previous
    unroll). `core` is a `memory.MemoryTransformer` or an `agents.RecurrentCore`.

    The encoder is chosen from the observation space (`agents.encoders.make_encoder`); on the
    MazeBase word window it is one linear map of the flattened multi-hot window. Actions are
    Discrete (one categorical head) or MultiDiscrete (independent categorical heads, one per
    component: the log-probability and the entropy of an action are the sums of its
    components'). With ``previous_action`` and/or ``previous_reward`` the agent also sees a
    one-hot of its previous action and the previous reward (zeros at an episode's start),
    concatenated to the encoded observation and projected back to ``dim``.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        core: nn.Module,
        dim: int,
        previous_action: bool = False,
        previous_reward: bool = False,
    ) -> None:
        super().__init__()
        self.action_sizes = action_sizes(action_space)
        self.multi_discrete = isinstance(action_space, spaces.MultiDiscrete)
        self.encoder = make_encoder(obs_space, dim)
        self.previous_action, self.previous_reward = previous_action, previous_reward
        self.previous_width = sum(self.action_sizes) * previous_action + previous_reward
        self.previous = None
        if self.previous_width:
            self.previous = nn.Sequential(nn.Linear(dim + self.previous_width, dim), nn.ReLU())
        self.core = core
        if self.multi_discrete:
            self.policy = MultiHead(dim, self.action_sizes)
            policy_layers = list(self.policy.heads)
        else:
            self.policy = nn.Linear(dim, self.action_sizes[0])
            policy_layers = [self.policy]
        self.value = nn.Linear(dim, 1)
        for layer in policy_layers:
            nn.init.orthogonal_(layer.weight, gain=0.01)
            nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.value.weight, gain=1.0)
        nn.init.zeros_(self.value.bias)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu"):
        """The core's empty state."""
        return self.core.initial_state(batch_size, device)

    def encode(
        self, obs: Any, episode_start: torch.Tensor, previous: Previous | None = None
    ) -> torch.Tensor:
        """The core's input for ``obs`` (a tensor, or a tuple or dict of them) and, if the
        agent sees them, the ``previous`` action and reward (None: none, as at a start)."""
        x = self.encoder(obs)
        if self.previous is None:
            return x
        seen = x.new_zeros((*x.shape[:-1], self.previous_width))
        if previous is not None:
            action, reward = previous
            parts = []
            if self.previous_action:
                components = action if self.multi_discrete else action[..., None]
                sizes = enumerate(self.action_sizes)
                parts += [F.one_hot(components[..., i], size).to(x.dtype) for i, size in sizes]
            if self.previous_reward:
                parts.append(reward[..., None].to(x.dtype))
            fresh = (~episode_start)[..., None].to(x.dtype)  # nothing came before a start
            seen = torch.cat(parts, dim=-1) * fresh
        return self.previous(torch.cat([x, seen], dim=-1))

    def forward(
        self,
        obs: Any,
        state,
        episode_start: torch.Tensor,
        previous: Previous | None = None,
    ) -> tuple[Logits, torch.Tensor, CoreOutput]:
        """Block mode: obs (B, T, *obs_shape), episode_start (B, T) -> logits (B, T, A) (a
        tuple of them, one per component, for MultiDiscrete actions), values (B, T) and the
        core's output."""
        x = self.encode(obs, episode_start, previous)
        out = self.core(x, state, episode_start)
        return self.policy(out.hidden), self.value(out.hidden).squeeze(-1), out

    @torch.no_grad()
    def act(
        self,
        obs: Any,
        state,
        episode_start: torch.Tensor,
        previous: Previous | None = None,
        greedy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CoreOutput]:
        """Step mode: obs (B, *obs_shape), episode_start (B,) -> action, its log-probability,
        the value estimate and the core's output (whose `state` is the next state)."""
        out = self.core.step(self.encode(obs, episode_start, previous), state, episode_start)
        logits = self.policy(out.hidden)
        action = sample(logits, greedy)
        log_prob, _ = log_prob_and_entropy(logits, action)
        return action, log_prob, self.value(out.hidden).squeeze(-1), out
