"""The native batched MazeBase environment: one core steps every game at once in NumPy.

`gymnasium.make_vec(id, num_envs, vectorization_mode="vector_entry_point", **kwargs)` builds it;
the game's keyword arguments and `autoreset_mode`, `render_mode`, `copy` all go in `kwargs`
(Gymnasium passes no `vector_kwargs` to a vector entry point). It behaves like a
`gymnasium.vector.SyncVectorEnv` over the single environments, observation for observation and
info for info: env i reset with `seed=s` plays what the single env reset with `seed=s + i` plays.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envs.mazebase import (
    ACTION_NAMES,
    ACTIONS_HELP,
    RENDER_MODES,
    MazeBaseCore,
    check_render_mode,
    generator_from_state,
    warn_no_render_mode,
)


class MazeBaseVectorEnv(VectorEnv):
    """`num_envs` MazeBase games stepped together, with Gymnasium 1.x autoreset.

    - `AutoresetMode.NEXT_STEP` (default): the step after an episode ends resets that env,
      ignores its action and returns its first observation with reward 0.
    - `AutoresetMode.SAME_STEP`: an env whose episode ends is reset in the same step; its last
      observation is in `info["final_obs"]` and its episode info in `info["final_info"]`.
    - `AutoresetMode.DISABLED`: reset ended envs with `reset(options={"reset_mask": mask})`.

    Episode outcomes (`success`, and `rooms_reached` for Portal) follow Gymnasium's vector info
    convention: `info[key]` has one entry per env, `info["_" + key]` marks the envs that have
    one. `render()` returns one frame per env (a tuple, as `SyncVectorEnv` does), so render a
    small batch. `copy=False` returns the observation buffer itself, overwritten by the next
    step, instead of a copy.
    """

    metadata = {"render_modes": RENDER_MODES, "render_fps": 8}
    core_class: type[MazeBaseCore]

    def __init__(
        self,
        num_envs: int,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        render_mode: str | None = None,
        copy: bool = True,
        **game_kwargs: Any,
    ) -> None:
        check_render_mode(render_mode)
        try:
            self.autoreset_mode = AutoresetMode(autoreset_mode)
        except ValueError as error:
            valid = [mode.value for mode in AutoresetMode]
            raise ValueError(f"autoreset_mode must be one of {valid}") from error
        self.core = self.core_class(num_envs, **game_kwargs)
        self.num_envs = self.core.num_envs
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.render_mode = render_mode
        self.copy = copy
        self.single_observation_space = self.core.window.observation_space
        self.single_action_space = spaces.Discrete(len(ACTION_NAMES))
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.vocab = self.core.window.vocab
        self.action_names = ACTION_NAMES
        self._seeded = [seeding.np_random() for _ in range(self.num_envs)]
        self._obs = np.zeros(self.observation_space.shape, dtype=np.uint8)
        self._ended = np.zeros(self.num_envs, dtype=bool)  # awaiting a reset (not in SAME_STEP)
        self._never_reset = np.ones(self.num_envs, dtype=bool)

    @property
    def np_random(self) -> tuple[np.random.Generator, ...]:
        """Each env's generator, like `SyncVectorEnv.np_random`."""
        return tuple(rng for rng, _ in self._seeded)

    @property
    def np_random_seed(self) -> tuple[int, ...]:
        return tuple(seed for _, seed in self._seeded)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset every env, or those in `options["reset_mask"]`; an int `seed` seeds env i with
        `seed + i`, a list gives one seed (or None) per env."""
        seeds = self._per_env_seeds(seed)
        env_ids = np.arange(self.num_envs)
        if options is not None and "reset_mask" in options:
            env_ids = np.flatnonzero(self._check_reset_mask(options["reset_mask"]))
        for i in env_ids:
            if seeds[i] is not None:
                self._seeded[i] = seeding.np_random(seeds[i])
        self._reset_games(env_ids)
        self._ended[env_ids] = False
        self._never_reset[env_ids] = False
        return self._observe(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = self._check_actions(actions)
        if self._never_reset.any():
            raise ResetNeeded(
                f"envs {np.flatnonzero(self._never_reset).tolist()} have not been reset: call "
                "reset() before step()"
            )
        if self.autoreset_mode == AutoresetMode.DISABLED and self._ended.any():
            raise RuntimeError(
                f"envs {np.flatnonzero(self._ended).tolist()} have ended: with autoreset "
                "disabled, reset them with reset(options={'reset_mask': mask}) before stepping"
            )
        reward, terminated, truncated = self.core.step(actions)
        if self.autoreset_mode == AutoresetMode.NEXT_STEP and self._ended.any():
            # These envs ended last step: their move above is discarded, as reset rewrites
            # all of a game's state.
            restarting = np.flatnonzero(self._ended)
            self._reset_games(restarting)
            reward[restarting] = 0.0
            terminated[restarting] = False
            truncated[restarting] = False
        ended = terminated | truncated
        info: dict[str, Any] = {}
        if ended.any():
            ended_ids = np.flatnonzero(ended)
            episode_info = self._vector_info(self.core.episode_info(ended_ids), ended_ids)
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                info = {
                    "final_obs": self._final_obs(ended_ids),
                    "_final_obs": ended.copy(),
                    "final_info": episode_info,
                    "_final_info": ended.copy(),
                }
                self._reset_games(ended_ids)
                ended[:] = False
            else:
                info = episode_info
        self._ended = ended
        return self._observe(), reward, terminated, truncated, info

    def state_dict(self) -> dict[str, Any]:
        """Everything the games' futures depend on: the core's state arrays, each env's random
        generator and seed, and which envs await a reset. NumPy arrays and plain values."""
        return {
            "core": self.core.state_dict(),
            "rngs": [rng.bit_generator.state for rng, _ in self._seeded],
            "seeds": [seed for _, seed in self._seeded],
            "ended": self._ended.copy(),
            "never_reset": self._never_reset.copy(),
        }

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        """Continue from `state_dict`: the same steps give the same games as they would have."""
        if len(saved["seeds"]) != self.num_envs:
            raise ValueError(f"the state holds {len(saved['seeds'])} envs, not {self.num_envs}")
        self.core.load_state_dict(saved["core"])
        self._seeded = [
            (generator_from_state(state), seed)
            for state, seed in zip(saved["rngs"], saved["seeds"], strict=True)
        ]
        self._ended = np.array(saved["ended"], dtype=bool)
        self._never_reset = np.array(saved["never_reset"], dtype=bool)

    def render(self) -> tuple[str | np.ndarray, ...] | None:
        if self.render_mode is None:
            warn_no_render_mode()
            return None
        return tuple(self.core.render(i, self.render_mode) for i in range(self.num_envs))

    def _reset_games(self, env_ids: np.ndarray) -> None:
        self.core.reset(env_ids, [self._seeded[i][0] for i in env_ids])

    def _observe(self) -> np.ndarray:
        self.core.observe(None, self._obs)
        return self._obs.copy() if self.copy else self._obs

    def _final_obs(self, env_ids: np.ndarray) -> np.ndarray:
        """The last observations of the envs that ended, as Gymnasium's object array."""
        last = self.core.observe(env_ids, np.empty((len(env_ids), *self._obs.shape[1:]), np.uint8))
        final_obs = np.full(self.num_envs, None, dtype=object)
        for i, obs in zip(env_ids, last, strict=True):
            final_obs[i] = obs
        return final_obs

    def _vector_info(self, values: dict[str, np.ndarray], env_ids: np.ndarray) -> dict[str, Any]:
        """Per-env values of `env_ids` spread over the batch, each with its `_key` mask."""
        info: dict[str, Any] = {}
        for key, value in values.items():
            info[key] = np.zeros(self.num_envs, dtype=value.dtype)
            info[key][env_ids] = value
            info[f"_{key}"] = np.zeros(self.num_envs, dtype=bool)
            info[f"_{key}"][env_ids] = True
        return info

    def _per_env_seeds(self, seed: int | Sequence[int | None] | None) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, numbers.Integral):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds for {self.num_envs} envs: give one per env")
        return seeds

    def _check_reset_mask(self, mask: Any) -> np.ndarray:
        if not (isinstance(mask, np.ndarray) and mask.dtype == bool):
            raise TypeError(f"options['reset_mask'] must be a bool numpy array, got {mask!r}")
        if mask.shape != (self.num_envs,):
            raise ValueError(
                f"options['reset_mask'] must have shape ({self.num_envs},), got {mask.shape}"
            )
        return mask

    def _check_actions(self, actions: Any) -> np.ndarray:
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(
                f"expected one action per env, an array of shape ({self.num_envs},), "
                f"got shape {actions.shape}"
            )
        if actions.dtype.kind not in "iu":
            raise ValueError(f"actions must be integers, got dtype {actions.dtype}")
        if actions.min() < 0 or actions.max() >= len(ACTION_NAMES):
            raise ValueError(f"actions must be in 0..3 ({ACTIONS_HELP}), got {actions}")
        return actions
