"""Playing an agent in vector envs: when their envs reset (same step or next step), which steps
start episodes, and the episodes' returns, lengths and outcomes (`EpisodeStats`)."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from agents.encoders import map_observation
from envs.registry import INFO_KEYS, named_env
from training.config import ConfigError


def to_device(obs: Any, device: torch.device | str) -> Any:
    """An observation (an array, or a tuple or dict of them) as tensors on ``device``, each
    with its own dtype."""
    return map_observation(lambda x: torch.as_tensor(x, device=device), obs)


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


def after_step(
    ended: np.ndarray, resetting: np.ndarray, next_step: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Which envs start an episode with the next step, and which envs' next step is a reset
    step (the action not taken), after a step that ended the episodes ``ended`` and was a
    reset step for ``resetting``: a same-step env starts the next episode at once, a
    next-step env one step later."""
    if next_step:
        return resetting, ended
    return ended, resetting


def episode_info(info: dict, next_step: bool) -> dict:
    """The info of the episodes that ended in a step: ``final_info`` when the envs reset in
    the same step, the step's own info when they reset in the next."""
    return info if next_step else info.get("final_info", {})


class EpisodeStats:
    """Running returns and lengths of a batch of environments, and the task's outcome of every
    episode that ends (`success`, or a Gymnasium env's `is_success`, and `rooms_reached` for
    Portal), as the info of the step that ended it reports them (`episode_info`)."""

    def __init__(self, num_envs: int, env_name: str, extra: tuple[str, ...] = ()) -> None:
        self.outcomes = named_env(env_name).outcomes + extra  # extra: more final info keys
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.finished: dict[str, list[float]] = {}

    def record(
        self,
        reward: np.ndarray,
        done: np.ndarray,
        final_info: dict,
        counted: np.ndarray,
        kept: np.ndarray | None = None,
    ) -> None:
        """One step: its rewards, which episodes it ended and their info (`episode_info`);
        ``counted``: False for a reset step, which belongs to no episode; ``kept``: False for
        an environment whose finished episodes are no longer wanted (evaluation's quotas)."""
        self.running_return += reward
        self.running_length += counted
        ended = done if kept is None else done & kept
        if ended.any():
            self._add("return", self.running_return[ended])
            self._add("episode_length", self.running_length[ended])
            for key in self.outcomes:
                reported = [name for name in INFO_KEYS.get(key, (key,)) if name in final_info]
                if reported:
                    present = final_info[f"_{reported[0]}"] & ended
                    self._add(key, final_info[reported[0]][present])
        self.running_return[done] = 0.0
        self.running_length[done] = 0

    def _add(self, key: str, values: np.ndarray) -> None:
        self.finished.setdefault(key, []).extend(values.astype(float).tolist())

    def state_dict(self) -> dict[str, Any]:
        """The running episodes and the finished ones not yet summarised, as tensors and lists."""
        return {
            "running_return": torch.from_numpy(self.running_return.copy()),
            "running_length": torch.from_numpy(self.running_length.copy()),
            "finished": {key: list(values) for key, values in self.finished.items()},
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.running_return = saved["running_return"].numpy().copy()
        self.running_length = saved["running_length"].numpy().copy()
        self.finished = {key: list(values) for key, values in saved["finished"].items()}

    @property
    def episodes(self) -> int:
        return len(self.finished.get("return", []))

    def summary(self) -> dict[str, float]:
        """Means over the episodes finished since the last summary (NaN when none did), then
        forget them. The keys are always the same, so ranks can average them."""
        means = {
            key: float(np.mean(self.finished[key])) if self.finished.get(key) else math.nan
            for key in ("return", "episode_length", *self.outcomes)
        }
        means["episodes"] = self.episodes
        self.finished = {}
        return means
