"""The episodes an agent plays: their returns, lengths and outcomes (`EpisodeStats`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from envs.registry import INFO_KEYS, named_env


def episode_info(info: dict, next_step: bool) -> dict:
    """The info of the episodes that ended in a step: ``final_info`` when the envs reset in
    the same step, the step's own info when they reset in the next."""
    return info if next_step else info.get("final_info", {})


class EpisodeStats:
    """Running returns and lengths of a batch of environments, whether each episode that ends
    was cut by its step limit (`truncated`: an agent that dithers, not one that chose wrong),
    and the task's outcome (`success`, or a Gymnasium env's `is_success`, and `rooms_reached`
    for Portal), as the info of the step that ended it reports them (`episode_info`)."""

    def __init__(self, num_envs: int, env_name: str, extra: tuple[str, ...] = ()) -> None:
        self.outcomes = named_env(env_name).outcomes + extra  # extra: more final info keys
        self.running_return = np.zeros(num_envs)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.finished: dict[str, list[float]] = {}

    def record(
        self,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_info: dict,
        counted: np.ndarray,
        kept: np.ndarray | None = None,
    ) -> None:
        """One step: its rewards, which episodes it ended and how, and their info
        (`episode_info`); ``counted``: False for a reset step, which belongs to no episode;
        ``kept``: False for an environment whose finished episodes are no longer wanted
        (evaluation's quotas)."""
        self.running_return += reward
        self.running_length += counted
        done = terminated | truncated
        ended = done if kept is None else done & kept
        if ended.any():
            self._add("return", self.running_return[ended])
            self._add("episode_length", self.running_length[ended])
            self._add("truncated", (truncated & ~terminated)[ended])
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
            for key in ("return", "episode_length", "truncated", *self.outcomes)
        }
        means["episodes"] = self.episodes
        self.finished = {}
        return means
