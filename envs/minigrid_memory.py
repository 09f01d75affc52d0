"""MiniGrid's memory tasks (`MiniGrid-MemoryS7-v0` ... `MiniGrid-MemoryS17Random-v0`) seen the
MazeBase way: a north-up window of words around the agent and four cardinal moves.

In these tasks the agent starts somewhere on the hallway row, a key or a ball (the cue) sits in
the start room at the hallway's west end, and at the east end a vertical passage has a key two
cells north of the hallway row and a ball two cells south (or the other way round). Stepping
next to the object matching the cue wins (MiniGrid's reward, 1 - 0.9 * steps / max_steps), next
to the other loses; both end the episode.

The default window is 5 x 5, not 3 x 3: the end objects are two rows off the hallway row, and
the cells between are the very cells that end the episode, so a 3 x 3 window never shows them
before the choice is made. A 5 x 5 window shows both from the junction, and shows the cue from
the hallway's west end (any odd window of 3 or more shows the cue from some cell next to it).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from minigrid.core.actions import Actions
from minigrid.core.constants import COLOR_TO_IDX, IDX_TO_OBJECT
from minigrid.core.grid import Grid
from minigrid.envs import MemoryEnv

from envs.mazebase import ACTION_NAMES, ACTIONS_HELP, check_int, generator_from_state
from envs.words import WordWindow

OBJECT_WORDS = ("floor", "door", "key", "ball", "box", "goal", "lava")
COLOR_WORDS = tuple(sorted(COLOR_TO_IDX, key=COLOR_TO_IDX.get))
VOCAB = ("agent", "block", *OBJECT_WORDS, *COLOR_WORDS)
MINIGRID_DIRECTION = (3, 0, 1, 2)  # our north, east, south, west as MiniGrid's agent_dir


def _cell_words() -> list[list[str]]:
    """Words of MiniGrid's cell code object_index * len(COLOR_WORDS) + color_index: walls read
    `block` (as cells beyond the grid do), objects their type and colour, empty cells nothing."""
    words = []
    for object_index in range(len(IDX_TO_OBJECT)):
        name = IDX_TO_OBJECT[object_index]
        for color in COLOR_WORDS:
            if name == "wall":
                words.append(["block"])
            elif name in OBJECT_WORDS:
                words.append([name, color])
            else:
                words.append([])  # unseen, empty, agent
    return words


WALL_CODE = next(i for i, words in enumerate(_cell_words()) if words == ["block"])


class MiniGridMemoryWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """A MiniGrid memory task with MazeBase observations and actions.

    - Observation: `Box(0, 1, (k, k, V), uint8)`, the k x k cells around the agent
      (`window_size`, default 5), north-up (`obs[row, col]`, row 0 north, col 0 west, the agent
      at the centre), each a multi-hot vector over `vocab`. The window sees through walls, as
      MazeBase's does, and cells beyond the grid read `block`.
    - Actions: `Discrete(4)`, 0 up (north), 1 right (east), 2 down (south), 3 left (west).
      Action k turns the agent to face that direction (by setting the underlying env's
      `agent_dir`, which costs no step) and then steps MiniGrid's `forward`, so one action is
      one MiniGrid step and MiniGrid's step limit, reward and termination are kept.
    - `info["success"]` (bool) at the last step of every episode: the agent reached the cell
      next to the object that matches the cue.

    Moving forward never changes a MiniGrid grid, so the grid is encoded once per episode.
    """

    def __init__(self, env: gym.Env, window_size: int = 5) -> None:
        if not isinstance(env.unwrapped, MemoryEnv):
            raise TypeError(
                "MiniGridMemoryWrapper wraps MiniGrid's memory tasks (MiniGrid-MemoryS*-v0), "
                f"got {env.unwrapped}"
            )
        gym.utils.RecordConstructorArgs.__init__(self, window_size=window_size)
        gym.Wrapper.__init__(self, env)
        check_int("window_size", window_size, 1)
        self._margin = window_size // 2
        self._row_stride = env.unwrapped.width + 2 * self._margin
        self._window = WordWindow(VOCAB, _cell_words(), self._row_stride, window_size)
        self.observation_space = self._window.observation_space
        self.action_space = spaces.Discrete(len(ACTION_NAMES))
        self.vocab = self._window.vocab
        self.action_names = ACTION_NAMES
        self._cells = np.empty(0, dtype=np.uint8)
        self._obs = np.zeros((1, *self.observation_space.shape), dtype=np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        _, info = self.env.reset(seed=seed, options=options)
        self._cells = self._encode_grid()
        return self._observe(), info

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an integer in 0..3 ({ACTIONS_HELP}), got {action!r}")
        memory_env = self.env.unwrapped
        memory_env.agent_dir = MINIGRID_DIRECTION[action]
        _, reward, terminated, truncated, info = self.env.step(Actions.forward)
        if terminated or truncated:
            success = tuple(int(v) for v in memory_env.agent_pos) == memory_env.success_pos
            info = {**info, "success": success}
        return self._observe(), float(reward), terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """The episode's state, NumPy arrays and plain values: the grid, the agent, the step
        count, where the two end objects are, and the env's random generator."""
        env = self.env.unwrapped
        return {
            "grid": env.grid.encode(),
            "agent": np.array([*env.agent_pos, env.agent_dir, env.step_count]),
            "ends": np.array([*env.success_pos, *env.failure_pos]),
            "rng": env.np_random.bit_generator.state,
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue the episode saved by `state_dict` (the env must have been reset once)."""
        env = self.env.unwrapped
        env.grid, _ = Grid.decode(saved["grid"])
        x, y, direction, steps = (int(v) for v in saved["agent"])
        env.agent_pos, env.agent_dir, env.step_count = np.array([x, y]), direction, steps
        ends = [int(v) for v in saved["ends"]]
        env.success_pos, env.failure_pos = tuple(ends[:2]), tuple(ends[2:])
        env.np_random = generator_from_state(saved["rng"])
        self._cells = self._encode_grid()

    def _encode_grid(self) -> np.ndarray:
        """The grid as flat cell codes, north row first, with `block` margins for the window."""
        encoded = self.env.unwrapped.grid.encode()  # (width, height, [object, colour, state])
        codes = encoded[:, :, 0] * len(COLOR_WORDS) + encoded[:, :, 1]
        return np.pad(codes.T, self._margin, constant_values=WALL_CODE).reshape(-1)

    def _observe(self) -> np.ndarray:
        x, y = self.env.unwrapped.agent_pos
        centre = np.array([(y + self._margin) * self._row_stride + x + self._margin])
        return self._window.observe(self._cells, centre, self._obs)[0].copy()


class _ViewAtResetMemoryEnv(MemoryEnv):
    """MiniGrid's memory task that builds its agent view (a rotated, encoded 7 x 7 crop) at
    resets only and hands a copy of the reset's view back at every step. The wrapper observes in
    words and never reads that view, whose building was most of a step's time
    (benchmarks/env_throughput.py)."""

    _view: dict[str, Any] | None = None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._view = None
        return super().reset(seed=seed, options=options)

    def gen_obs(self) -> dict[str, Any]:
        if self._view is None:
            self._view = super().gen_obs()
        return {**self._view, "image": self._view["image"].copy()}


def make_minigrid_memory(
    env_id: str, window_size: int = 5, render_mode: str | None = None, **kwargs: Any
) -> MiniGridMemoryWrapper:
    """One wrapped memory task, e.g. `make_minigrid_memory("MiniGrid-MemoryS13Random-v0")`;
    `kwargs` go to MiniGrid's env."""
    spec = gym.spec(env_id)
    if spec.entry_point != "minigrid.envs:MemoryEnv":
        raise ValueError(
            f"{env_id} is not one of MiniGrid's memory tasks: pick an id from "
            "MiniGrid-MemoryS7-v0 ... MiniGrid-MemoryS17Random-v0"
        )
    spec = replace(spec, entry_point=_ViewAtResetMemoryEnv)
    return MiniGridMemoryWrapper(gym.make(spec, render_mode=render_mode, **kwargs), window_size)


class MiniGridMemoryVectorEnv(SyncVectorEnv):
    """Wrapped memory tasks stepped one after the other, with a state to resume from."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "envs": [env.state_dict() for env in self.envs],
            "autoreset": self._autoreset_envs.copy(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from `state_dict` (after a reset: MiniGrid's envs must have been reset)."""
        for env, state in zip(self.envs, saved["envs"], strict=True):
            env.load_state_dict(state)
        self._autoreset_envs = np.array(saved["autoreset"], dtype=bool)


def make_minigrid_memory_vec(
    env_id: str,
    num_envs: int,
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    window_size: int = 5,
    **kwargs: Any,
) -> MiniGridMemoryVectorEnv:
    """`num_envs` wrapped memory tasks in a `SyncVectorEnv` (MiniGrid steps one env at a time)."""
    make = partial(make_minigrid_memory, env_id, window_size, **kwargs)
    return MiniGridMemoryVectorEnv([make] * num_envs, autoreset_mode=AutoresetMode(autoreset_mode))
