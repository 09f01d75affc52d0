"""One unroll of training: T steps of play in step mode, kept (B, T) for the learner's block
mode (`Unroll`, `collect_unroll`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from gymnasium.vector.utils import concatenate, create_empty_array

from agents.actor_critic import ActorCritic, Previous
from agents.encoders import map_observation
from agents.play import Player, Step, to_device
from training.metrics import SpanStats


class Unroll:
    """The buffers of one unroll of T steps of B environments, laid out (B, T), and what the
    learner's block mode starts from: the memory and the previous action and reward before the
    unroll's first step (``start_state``, ``start_previous``)."""

    def __init__(self, player: Player, length: int) -> None:
        num_envs, device = player.vec_env.num_envs, player.device
        shape = (num_envs, length)
        self.obs = map_observation(lambda x: x.new_zeros((*shape, *x.shape[1:])), player.obs)
        action = player.previous[0]
        self.actions = action.new_zeros((*shape, *action.shape[1:]))
        self.log_probs, self.values, self.rewards, self.dones = (
            torch.zeros(shape, device=device) for _ in range(4)
        )
        # V(final observation) of the steps that truncated an episode (else 0)
        self.truncation_values = torch.zeros(shape, device=device)
        self.starts = torch.zeros(shape, dtype=torch.bool, device=device)
        # False for the reset steps of a next-step env: their action was not taken
        self.valid = torch.ones(shape, dtype=torch.bool, device=device)
        # (B,) the envs that acted by their most likely action: the losses leave them out
        self.greedy = torch.zeros(num_envs, dtype=torch.bool, device=device)
        # True for the steps of an episode that a step limit cut within the unroll (never a
        # reset step: that belongs to the next episode)
        self.cut_episodes = torch.zeros(shape, dtype=torch.bool, device=device)
        self.bootstrap_value = torch.zeros(num_envs, device=device)  # V after the last step
        self.start_state: Any = None
        self.start_previous: Previous | None = None
        self.memory_size = 0.0  # the mean over the unroll's steps of the memories read
        self._kept: list[tuple[torch.Tensor, ...]] = []  # (`store`)
        self._ended: list[tuple[np.ndarray, np.ndarray]] = []
        self._memory_sizes: list[torch.Tensor | float] = []

    @property
    def length(self) -> int:
        return self.rewards.shape[1]

    @property
    def mask(self) -> torch.Tensor | None:
        """Which samples the losses count: the valid steps of the envs that sampled their
        actions; None when all do."""
        mask = self.valid & ~self.greedy[:, None]
        return None if bool(mask.all()) else mask

    def previous(self) -> Previous:
        """What the agent saw before each step besides the observation: the unroll's actions
        and rewards shifted by one step, (B, T)."""
        first_action, first_reward = self.start_previous
        return (
            torch.cat([first_action[:, None], self.actions[:, :-1]], dim=1),
            torch.cat([first_reward[:, None], self.rewards[:, :-1]], dim=1),
        )

    def store(self, step: Step) -> None:
        """Keeps the next step until `stored` writes all the steps' at once (an operation for
        each buffer instead of two for each step; the player's observations are its own)."""
        ended = step.terminated | step.truncated | ~step.counted
        kept = (step.obs, step.episode_start, step.action, step.log_prob, step.value, step.reward)
        self._kept.append(kept)
        self._ended.append((step.counted, ended, step.cut))
        self._memory_sizes.append(step.out.memory_size)

    def stored(self) -> None:
        """Writes the steps `store` kept into the buffers, and the mean of their memory sizes
        (read once an unroll)."""
        observations, starts, actions, log_probs, values, rewards = zip(*self._kept, strict=True)
        map_observation(
            lambda buffer, *kept: torch.stack(kept, 1, out=buffer), self.obs, *observations
        )
        for buffer, kept in (
            (self.starts, starts),
            (self.actions, actions),
            (self.log_probs, log_probs),
            (self.values, values),
            (self.rewards, rewards),
        ):
            torch.stack(kept, 1, out=buffer)
        counted, ended, cut = (np.stack(kept, 1) for kept in zip(*self._ended, strict=True))
        self.valid.copy_(torch.as_tensor(counted))
        self.dones.copy_(torch.as_tensor(ended))
        self.cut_episodes.copy_(torch.as_tensor(episodes_ending_in(ended, cut)))
        sizes = self._memory_sizes  # (0-d tensors, or numbers for a core without memory)
        total = torch.stack(sizes).sum() if isinstance(sizes[0], torch.Tensor) else sum(sizes)
        self.memory_size = float(total) / self.length
        self._kept, self._ended, self._memory_sizes = [], [], []


def episodes_ending_in(ended: np.ndarray, how: np.ndarray) -> np.ndarray:
    """Which steps (B, T) belong to an episode whose end within the unroll (``ended``) is
    marked in ``how`` (e.g. a cut by a step limit): the steps up to and including such an end,
    back to the end before it."""
    num_envs, length = ended.shape
    end_steps = np.where(ended, np.arange(length), length)
    next_end = np.minimum.accumulate(end_steps[:, ::-1], axis=1)[:, ::-1]
    how = np.concatenate([how, np.zeros((num_envs, 1), dtype=bool)], axis=1)
    return np.take_along_axis(how, next_end, axis=1)


def collect_unroll(
    agent: ActorCritic,
    player: Player,
    unroll: Unroll,
    span_stats: SpanStats,
    bootstrap_truncated: bool,
    greedy: torch.Tensor | None = None,
) -> None:
    """Acts for T steps in step mode and fills ``unroll``. The carried memory is first read
    with the current weights, as the learner will read it (`refresh`), and kept as the memory
    the unroll starts from. With ``bootstrap_truncated`` the last step of an episode that a
    step limit cut bootstraps from the value of its final observation. The envs ``greedy``
    ((B,) bool; None: none) act by their most likely action, and the player's episode
    statistics leave their episodes out."""
    agent.eval()
    player.state = agent.core.refresh(player.state)
    unroll.start_state, unroll.start_previous = player.state, player.previous
    unroll.truncation_values.zero_()
    acting, kept = False, None
    unroll.greedy.zero_()
    if greedy is not None:
        unroll.greedy.copy_(greedy)
        acting, kept = greedy, ~greedy.cpu().numpy()
    for t in range(unroll.length):
        step = player.step(agent, acting, kept)
        unroll.store(step)
        span_stats.add(step.out.spans)
        cut = step.cut & bootstrap_truncated
        if player.next_step:  # bootstrapped from the reset step's value, after the unroll
            unroll.truncation_values[:, t] = torch.as_tensor(cut, device=player.device)
        elif cut.any():
            final_obs = step.info["final_obs"][cut]
            unroll.truncation_values[cut, t] = final_values(agent, player, final_obs, cut, step)
    unroll.stored()
    # The bootstrap value (its state is not kept).
    _, _, unroll.bootstrap_value, _ = agent.act(
        player.obs, player.state, player.episode_start, player.previous
    )
    if player.next_step:  # a reset step acted on the final observation of the episode before
        next_values = torch.cat([unroll.values[:, 1:], unroll.bootstrap_value[:, None]], dim=1)
        unroll.truncation_values.mul_(next_values)


def final_values(
    agent: ActorCritic, player: Player, final_obs: np.ndarray, truncated: np.ndarray, step: Step
) -> torch.Tensor:
    """The values of the final observations ``final_obs`` of the episodes ``truncated`` (B,)
    by a step limit in ``step``, each read with the memory it had before its env reset."""
    space = player.vec_env.single_observation_space
    obs = concatenate(space, list(final_obs), create_empty_array(space, len(final_obs)))
    index = torch.as_tensor(np.flatnonzero(truncated), device=player.device)
    continuing = torch.zeros(len(index), dtype=torch.bool, device=player.device)
    chosen = (step.action[index], step.reward[index])
    state = step.out.state.select(index)
    # (greedy: no sample is drawn, so the random streams are those of a run without limit)
    _, _, value, _ = agent.act(to_device(obs, player.device), state, continuing, chosen, True)
    return value
