"""An agent playing a batch of environments in step mode (`Player`): the one loop that
training, evaluation and recording share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import create_empty_array

from agents.actor_critic import ActorCritic, Previous
from agents.core import Core
from agents.encoders import map_observation
from agents.episodes import EpisodeStats, episode_info
from envs.vector import MazeBaseVectorEnv
from memory import CoreOutput
from training.config import ConfigError, RunError

PER_ENV_SEEDS = (gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv, MazeBaseVectorEnv)


class NonFiniteEnvOutput(RunError):
    """An environment returned an observation or a reward that is not finite: nothing can be
    learnt from it, and it would reach the losses as NaN."""

    kind = "Environment error"

    def __init__(self, message: str, env: int, played: int) -> None:
        super().__init__(message)
        self.env, self.played = env, played  # which environment; its vector step, from 1

    def at_step(self, env_id: str, step: int) -> NonFiniteEnvOutput:
        """This error naming the env's id and the run's step, which the player cannot know."""
        return NonFiniteEnvOutput(f"env.id={env_id}: {self} at step {step}", self.env, self.played)


def refuse_nonfinite(obs: Any, reward: np.ndarray, info: dict, played: int) -> None:
    """Raises NonFiniteEnvOutput at the first environment whose reward, or a float part of
    whose observation or final observation (an episode's last, which autoreset puts in
    ``info``), is not finite (``played``: the vector step that returned them)."""
    every = np.arange(len(reward))
    batches = [("reward", every, np.asarray(reward))]
    batches += [("observation", every, part) for part in observation_parts(obs)]
    ended = np.flatnonzero(info.get("_final_obs", ()))
    for env in ended:
        final = observation_parts(info["final_obs"][env])
        batches += [("final observation", [env], part[None]) for part in final]
    for quantity, envs, values in batches:
        if values.dtype.kind != "f":
            continue
        finite = np.isfinite(values.reshape(len(values), -1)).all(axis=1)
        if not finite.all():
            first = int(np.argmin(finite))
            row, env = np.asarray(values[first]), int(envs[first])
            value = row[~np.isfinite(row)].flat[0]
            message = f"environment {env} returned a non-finite {quantity} ({value})"
            raise NonFiniteEnvOutput(message, env, played)


def observation_parts(obs: Any) -> list[np.ndarray]:
    """The arrays of an observation (a Tuple's or Dict's parts)."""
    parts = []
    map_observation(lambda part: parts.append(np.asarray(part)), obs)
    return parts


def to_device(obs: Any, device: torch.device | str, copy: bool = False) -> Any:
    """An observation (an array, or a tuple or dict of them) as tensors on ``device``, each
    with its own dtype; with ``copy``, tensors of their own (`to_torch`)."""
    return map_observation(lambda x: to_torch(x, device, copy), obs)


def to_torch(array: Any, device: torch.device | str, copy: bool = False) -> torch.Tensor:
    """An array (what `np.asarray` takes) as a tensor on ``device``: on a CPU the array's own
    memory (`torch.from_numpy`, an operation where `torch.as_tensor` calls two, every step), or
    with ``copy`` NumPy's copy of it (no operation), which the array's owner cannot change."""
    cpu = torch.device(device).type == "cpu"
    tensor = torch.from_numpy(np.array(array) if copy and cpu else np.asarray(array))
    return tensor if cpu else tensor.to(device)


def resets_next_step(vec_env: gym.vector.VectorEnv) -> bool:
    """Whether ``vec_env`` resets an env in the step after the one that ended its episode
    (Gymnasium's next-step autoreset, as CartPole's own vector env does) rather than in the
    same step. That reset step ignores the action and ends nothing."""
    mode = AutoresetMode(vec_env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
    if mode == AutoresetMode.DISABLED:
        raise ConfigError(
            "the vector env does not reset its envs itself (autoreset disabled); use "
            "env.vectorization=sync"
        )
    return mode == AutoresetMode.NEXT_STEP


@dataclass
class Step:
    """One step of play: what the agent saw and did, and what the environments returned."""

    obs: Any  # the observations acted on
    episode_start: torch.Tensor  # (B,) which of them start an episode
    counted: np.ndarray  # (B,) False for a next-step env's reset step: its action was ignored
    action: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    out: CoreOutput  # the core's output; out.state is the memory after the step
    reward: torch.Tensor  # (B,) float32
    terminated: np.ndarray
    truncated: np.ndarray
    info: dict

    @property
    def cut(self) -> np.ndarray:
        """(B,) which episodes a step limit ended (truncated and not terminated)."""
        return self.truncated & ~self.terminated


class Player:
    """Plays an agent in the vector env ``vec_env`` and carries what one step hands the next:
    the observation, the core's memory, which envs start an episode, the previous action and
    reward, and the episodes' statistics (``stats``). With Gymnasium's next-step autoreset an
    env's step after the one that ended its episode is a reset step (`resets_next_step`):
    its action is ignored, and the step that follows starts the episode."""

    def __init__(
        self, vec_env: gym.vector.VectorEnv, agent: ActorCritic, stats: EpisodeStats
    ) -> None:
        self.vec_env, self.stats = vec_env, stats
        self.next_step = resets_next_step(vec_env)
        self.device = next(agent.parameters()).device
        num_envs = vec_env.num_envs
        self.obs: Any = None
        self.state = agent.initial_state(num_envs, self.device)
        self.episode_start = torch.ones(num_envs, dtype=torch.bool, device=self.device)
        self.resetting = np.zeros(num_envs, dtype=bool)  # next-step envs: a reset step now
        self.played = 0  # vector steps played
        no_action = create_empty_array(vec_env.single_action_space, num_envs)
        self.previous: Previous = (  # (what an episode's first step sees: nothing)
            torch.as_tensor(no_action, device=self.device),
            torch.zeros(num_envs, device=self.device),
        )

    def reset(self, seeds: list[int] | None) -> None:
        """The first reset, which seeds each env (`training.seeding.env_seeds`); autoreset
        continues each env's own stream after it."""
        obs, _ = self.vec_env.reset(seed=seeds_taken_by(self.vec_env, seeds))
        self.obs = to_device(obs, self.device, copy=True)  # (`step`'s, kept by an unroll)

    def step(
        self,
        agent: ActorCritic,
        greedy: bool | torch.Tensor = False,
        kept: np.ndarray | None = None,
    ) -> Step:
        """The agent acts on the current observations (``greedy``: by its most likely actions,
        in every env or in those of a (B,) bool tensor), the envs step; ``kept``: which envs'
        finished episodes ``stats`` still counts (None: all)."""
        action, log_prob, value, out = agent.act(
            self.obs, self.state, self.episode_start, self.previous, greedy
        )
        next_obs, reward, terminated, truncated, info = self.vec_env.step(self.env_action(action))
        self.played += 1
        refuse_nonfinite(next_obs, reward, info, self.played)
        ended = terminated | truncated
        counted = ~self.resetting
        final_info = episode_info(info, self.next_step)
        self.stats.record(reward, terminated, truncated, final_info, counted, kept)
        reward = to_torch(np.array(reward, np.float32), self.device)  # (a copy: an env's array)
        step = Step(
            obs=self.obs,
            episode_start=self.episode_start,
            counted=counted,
            action=action,
            log_prob=log_prob,
            value=value,
            out=out,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            info=info,
        )
        self.state, self.previous = out.state, (action, reward)
        self.obs = to_device(next_obs, self.device, copy=True)  # (an unroll keeps them)
        # A same-step env starts its next episode at once, a next-step env after its reset step.
        starting = self.resetting if self.next_step else ended
        if self.next_step:
            self.resetting = ended
        self.episode_start = to_torch(starting, self.device)
        return step

    def env_action(self, action: torch.Tensor) -> np.ndarray:
        """The action as the envs take it: a Box action clipped to the space's bounds (the
        agent keeps the sampled one, whose log-probability the learner uses)."""
        # the tensor's memory (no operation, where `Tensor.numpy` calls four)
        action = np.from_dlpack(action if action.is_cpu else action.cpu())
        space = self.vec_env.single_action_space
        if isinstance(space, gym.spaces.Box):
            return np.clip(action, space.low, space.high)
        return action

    def state_dict(self, core: Core) -> dict[str, Any]:
        """What the next step continues from, as tensors and plain values (to resume within an
        episode); the envs' own state where they have one (`None` where they have not). The
        agent's ``core`` saves its memory (``save_state``)."""
        exact_envs = hasattr(self.vec_env, "state_dict")  # a user's env may have none
        return {
            "envs": _as_tensors(self.vec_env.state_dict()) if exact_envs else None,
            "obs": map_observation(torch.Tensor.cpu, self.obs),
            "episode_start": self.episode_start.cpu(),
            "resetting": torch.from_numpy(self.resetting.copy()),
            "previous": [x.cpu() for x in self.previous],
            "memory": core.save_state(self.state),
            "episodes": self.stats.state_dict(),
        }

    def load_state_dict(self, saved: dict[str, Any], core: Core) -> None:
        """Continue from `state_dict`; the agent's ``core``, its weights loaded, loads the
        memory (``load_state``)."""
        self.vec_env.load_state_dict(_as_arrays(saved["envs"]))
        self.obs = to_device(saved["obs"], self.device)
        self.episode_start = saved["episode_start"].to(self.device)
        self.resetting = saved["resetting"].numpy().copy()
        self.previous = tuple(x.to(self.device) for x in saved["previous"])
        self.state = core.load_state(saved["memory"], self.device)
        self.stats.load_state_dict(saved["episodes"])


def seeds_taken_by(vec_env: gym.vector.VectorEnv, seeds: list[int] | None) -> Any:
    """`seeds`, one per env, as `vec_env` takes them. Gymnasium's vector envs over single envs
    and the MazeBase cores seed each env; another batched env (a vector entry point, such as
    CartPole's) seeds its one generator with the first."""
    if seeds is None or isinstance(vec_env.unwrapped, PER_ENV_SEEDS):
        return seeds
    return seeds[0]


def _as_tensors(value: Any) -> Any:
    """``value`` with its NumPy arrays as tensors, so that it loads with weights_only=True."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {key: _as_tensors(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_as_tensors(item) for item in value]
    return value


def _as_arrays(value: Any) -> Any:
    """The inverse of `_as_tensors`."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: _as_arrays(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_as_arrays(item) for item in value]
    return value
