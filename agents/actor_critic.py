"""The actor-critic agent: observation encoder, a memory core, policy and value heads."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn

from agents.compiled_step import CompiledStep
from agents.core import Core
from agents.distributions import (
    Gaussian,
    PolicyParams,
    most_likely_where,
    sample,
    sampling_noise,
)
from agents.encoders import check_observation_space, make_encoder
from memory import CoreOutput
from memory.linear import Linear
from training.host import acting_threads

# What the agent saw besides the observation: the previous action and the previous reward,
# (B,) or (B, T) (MultiDiscrete and Box actions: (..., components)), zeros at episode starts.
Previous = tuple[torch.Tensor, torch.Tensor]


class MultiHead(nn.Module):
    """Independent categorical heads, one Linear per component of a MultiDiscrete action."""

    def __init__(self, dim: int, sizes: tuple[int, ...]) -> None:
        super().__init__()
        self.heads = nn.ModuleList(Linear(dim, size) for size in sizes)

    def forward(self, hidden: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(head(hidden) for head in self.heads)


class GaussianHead(nn.Module):
    """A diagonal Gaussian over Box actions: a Linear gives the mean; the log standard
    deviation is a parameter per dimension, the same in every state (as in PPO's continuous
    control), starting at 0 (std 1)."""

    def __init__(self, dim: int, size: int) -> None:
        super().__init__()
        self.mean = Linear(dim, size)
        self.log_std = nn.Parameter(torch.zeros(size))

    def forward(self, hidden: torch.Tensor) -> Gaussian:
        mean = self.mean(hidden)
        return Gaussian(mean, self.log_std.expand_as(mean))


def action_width(space: spaces.Space) -> int:
    """How wide the agent sees an action of ``space`` (a one-hot per categorical component, or
    a Box action's values); a ValueError for a space the agent cannot act in. It acts in
    Discrete and one-dimensional MultiDiscrete spaces starting at 0 (categorical policies) and
    one-dimensional Box spaces (a diagonal Gaussian)."""
    if isinstance(space, spaces.Discrete) and space.start == 0:
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete) and space.nvec.ndim == 1 and not space.start.any():
        return int(space.nvec.sum())
    if isinstance(space, spaces.Box) and len(space.shape) == 1:
        return space.shape[0]
    if isinstance(space, spaces.Tuple | spaces.Dict):
        raise ValueError(
            f"action space {space} is not supported: an action of several parts needs a joint "
            "policy the agent does not have; wrap the env to act through one Discrete, "
            "MultiDiscrete or one-dimensional Box space"
        )
    raise ValueError(
        f"action space {space} is not supported: the agent acts in Discrete or "
        "one-dimensional MultiDiscrete spaces starting at 0 (categorical policies) and "
        "one-dimensional Box spaces (a Gaussian policy); flatten or wrap it into one of them"
    )


def check_spaces(obs_space: spaces.Space, action_space: spaces.Space) -> None:
    """Raises ValueError, saying how to fix it, unless the agent can act in ``action_space``
    (`action_width`) and observe ``obs_space`` (`check_observation_space`): what a run checks
    of the env it made before it builds the agent."""
    action_width(action_space)
    check_observation_space(obs_space)


def policy_head(space: spaces.Space, dim: int) -> tuple[nn.Module, list[nn.Linear]]:
    """The policy head for ``space`` (checked by `action_width`) and its output layers, which
    start small: a categorical, independent categoricals or a diagonal Gaussian."""
    if isinstance(space, spaces.Box):
        head = GaussianHead(dim, space.shape[0])
        return head, [head.mean]
    if isinstance(space, spaces.MultiDiscrete):
        head = MultiHead(dim, tuple(int(n) for n in space.nvec))
        return head, list(head.heads)
    head = Linear(dim, int(space.n))
    return head, [head]


class ActorCritic(nn.Module):
    """Acts in step mode (one timestep for a batch of environments) and is trained in
    block mode (a whole unroll at once, from the memory carried over from the previous
    unroll). `core` is a `memory.MemoryTransformer` or a baseline (`agents.core.Core`).

    The encoder is chosen from the observation space (`agents.encoders.make_encoder`); on the
    MazeBase word window it is one linear map of the flattened multi-hot window. Box
    observations of unknown scale are normalised by running statistics first
    (``normalise_observations``, "auto": those of unbounded float Boxes). Actions are
    Discrete (one categorical head), MultiDiscrete (independent categorical heads, one per
    component: the log-probability and the entropy of an action are the sums of its
    components') or a one-dimensional Box (a diagonal Gaussian; the env clips the sampled
    action to its bounds, `agents.play.Player`). With ``previous_action`` and/or
    ``previous_reward`` the agent also sees its previous action (a one-hot per component, or a
    Box action's values) and the previous reward (zeros at an episode's start), concatenated
    to the encoded observation and projected back to ``dim``.
    """

    def __init__(
        self,
        obs_space: spaces.Space,
        action_space: spaces.Space,
        core: Core,
        dim: int,
        previous_action: bool = False,
        previous_reward: bool = False,
        normalise_observations: bool | str = "auto",
    ) -> None:
        super().__init__()
        self.action_space = action_space
        seen_width = action_width(action_space)
        self.encoder = make_encoder(obs_space, dim, normalise_observations)
        self.previous_action, self.previous_reward = previous_action, previous_reward
        self.previous_width = seen_width * previous_action + previous_reward
        self.previous = None
        if self.previous_width:
            self.previous = nn.Sequential(Linear(dim + self.previous_width, dim), nn.ReLU())
        self.core = core
        self.policy, policy_layers = policy_head(action_space, dim)
        self.value = Linear(dim, 1)
        for layer in policy_layers:
            nn.init.orthogonal_(layer.weight, gain=0.01)
            nn.init.zeros_(layer.bias)
        nn.init.orthogonal_(self.value.weight, gain=1.0)
        nn.init.zeros_(self.value.bias)
        self.compiled_step: CompiledStep | None = None  # `compile_acting`

    def compile_acting(self) -> None:
        """Act through `agents.compiled_step.CompiledStep`, compiled at the first step: a
        memory transformer whose memories step in their buffers (not the compressive kind;
        other cores act eagerly)."""
        if self.core.steps_in_buffers:
            self.compiled_step = CompiledStep()

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
                parts += self.seen_action(action, x.dtype)
            if self.previous_reward:
                parts.append(reward[..., None].to(x.dtype))
            fresh = (~episode_start)[..., None].to(x.dtype)  # nothing came before a start
            seen = torch.cat(parts, dim=-1) * fresh
        return self.previous(torch.cat([x, seen], dim=-1))

    def seen_action(self, action: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        """A previous action as the agent's input: a one-hot per categorical component, or a
        Box action's values."""
        space = self.action_space
        if isinstance(space, spaces.Box):
            return [action.to(dtype)]
        if isinstance(space, spaces.Discrete):
            return [F.one_hot(action, int(space.n)).to(dtype)]
        return [F.one_hot(action[..., i], int(n)).to(dtype) for i, n in enumerate(space.nvec)]

    def forward(
        self,
        obs: Any,
        state,
        episode_start: torch.Tensor,
        previous: Previous | None = None,
        next_state: bool = True,
    ) -> tuple[PolicyParams, torch.Tensor, CoreOutput]:
        """Block mode: obs (B, T, *obs_shape), episode_start (B, T) -> the policy (logits
        (B, T, A); a tuple of them, one per component, for MultiDiscrete actions; a Gaussian
        for Box actions), values (B, T) and the core's output (whose ``state`` is None
        without ``next_state``: a learner's minibatch saves the memory's deletions)."""
        x = self.encode(obs, episode_start, previous)
        out = self.core(x, state, episode_start, next_state)
        return self.policy(out.hidden), self.value(out.hidden).squeeze(-1), out

    @torch.no_grad()
    def act(
        self,
        obs: Any,
        state,
        episode_start: torch.Tensor,
        previous: Previous | None = None,
        greedy: bool | torch.Tensor = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CoreOutput]:
        """Step mode: obs (B, *obs_shape), episode_start (B,) -> action, its log-probability,
        the value estimate and the core's output (whose `state` is the next state); ``greedy``:
        the most likely actions (True), or those of some environments ((B,) bool), the others
        sampled. Runs on as many CPU threads as its few-row operations keep busy
        (`acting_threads`)."""
        batch, width = episode_start.shape[0], self.value.in_features
        dtype, device = self.value.weight.dtype, episode_start.device
        noise = None
        if greedy is not True:
            noise = sampling_noise(self.action_space, batch, dtype, device)
            if isinstance(greedy, torch.Tensor):
                noise = most_likely_where(self.action_space, noise, greedy)
        with acting_threads(batch * width):
            compiled = self.compiled_step
            if compiled is not None and compiled.handles(batch, previous, noise is None):
                return compiled(self, obs, state, episode_start, previous, noise)
            x = self.encode(obs, episode_start, previous)
            out = self.core.step(x, state, episode_start)
            action, log_prob = sample(self.policy(out.hidden), noise)
            return action, log_prob, self.value(out.hidden).squeeze(-1), out
