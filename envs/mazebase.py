"""What the MazeBase games share: the colour palette, the kinds of cell and the batched core.

A core holds the state of `num_envs` games in plain arrays and advances all of them at once in
NumPy. The Gymnasium classes around it are thin: `MazeBaseEnv` is a core of one game and
`envs.vector.MazeBaseVectorEnv` a core of many. Both run the same code and each game draws from
its own random generator, so the single and the batched environment give the same trajectories
for the same seeds and actions.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs import rendering
from envs.words import WordWindow

# Colour name: (its letter in the text picture, its RGB in the image).
COLORS: dict[str, tuple[str, tuple[int, int, int]]] = {
    "red": ("r", (220, 50, 47)),
    "green": ("g", (60, 180, 75)),
    "blue": ("b", (45, 110, 230)),
    "yellow": ("y", (240, 205, 40)),
    "purple": ("p", (150, 80, 210)),
    "orange": ("o", (245, 135, 30)),
    "cyan": ("c", (40, 200, 210)),
    "magenta": ("m", (225, 60, 180)),
}
ACTION_NAMES = ("up", "right", "down", "left")  # action k moves north, east, south, west
ACTIONS_HELP = "0 up (north), 1 right (east), 2 down (south), 3 left (west)"
RENDER_MODES = ["ansi", "rgb_array"]


def check_int(name: str, value: Any, minimum: int, reason: str = "") -> int:
    """`value` as an int, or a clear error if it is not an integer >= `minimum`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}{reason}, got {value}")
    return int(value)


def generator_from_state(state: dict[str, Any]) -> np.random.Generator:
    """A NumPy generator continuing from `state`, a `bit_generator.state` saved earlier."""
    generator = np.random.Generator(getattr(np.random, state["bit_generator"])())
    generator.bit_generator.state = state
    return generator


def check_palette(colors: Sequence[str]) -> tuple[str, ...]:
    """The palette as a tuple: at least two distinct known colours (two doors differ)."""
    if isinstance(colors, str):
        raise TypeError(f"colors must be a sequence of colour names, got the string {colors!r}")
    colors = tuple(colors)
    unknown = [color for color in colors if color not in COLORS]
    if unknown:
        raise ValueError(f"unknown colour(s) {unknown}; the known colours are {list(COLORS)}")
    if len(set(colors)) != len(colors):
        raise ValueError(f"the colours of the palette must be distinct, got {list(colors)}")
    if len(colors) < 2:
        raise ValueError(
            f"the palette needs at least 2 colours (the two doors have different colours), "
            f"got {list(colors)}"
        )
    return colors


def check_render_mode(render_mode: str | None) -> None:
    if render_mode is not None and render_mode not in RENDER_MODES:
        raise ValueError(f"render_mode must be None or one of {RENDER_MODES}, got {render_mode!r}")


def warn_no_render_mode() -> None:
    gym.logger.warn(f"render() needs a render_mode: make the env with one of {RENDER_MODES}")


class MazeBaseCells:
    """The kinds of cell of a MazeBase map, numbered by code, and what each code means.

    Code 0 is empty floor and 1 a block; then, for each colour of the palette, a cue (if the game
    has one), a good door and a bad door. A good and a bad door of one colour read the same
    words: which door is good is hidden from the agent, and keeping it in the code lets a step
    look it up with no second map.
    """

    EMPTY = 0
    BLOCK = 1

    def __init__(self, colors: Sequence[str], with_cue: bool) -> None:
        self.colors = check_palette(colors)
        kinds = [("empty", None), ("block", None)]
        if with_cue:
            kinds += [("cue", color) for color in self.colors]
        kinds += [("good door", color) for color in self.colors]
        kinds += [("bad door", color) for color in self.colors]
        self.kinds: list[tuple[str, str | None]] = kinds
        code = {kind: i for i, kind in enumerate(kinds)}
        self.cue = np.array([code["cue", c] for c in self.colors]) if with_cue else None
        self.good_door = np.array([code["good door", c] for c in self.colors])
        self.bad_door = np.array([code["bad door", c] for c in self.colors])
        names = np.array([name for name, _ in kinds])
        self.is_door = np.isin(names, ["good door", "bad door"])
        self.is_good_door = names == "good door"
        self.enterable = self.is_door | (names == "empty")  # cues and blocks stop the agent
        self.vocab = ["agent", "block", *(["cue"] if with_cue else []), "door", *self.colors]
        self.words = [self._words(name, color) for name, color in kinds]
        self.letters = np.array([self._letter(name, color) for name, color in kinds])
        self.rgb = [COLORS[color][1] if color else None for _, color in kinds]
        self.legend = self._legend(with_cue)

    @staticmethod
    def _words(name: str, color: str | None) -> list[str]:
        if name == "empty":
            return []
        if name == "block":
            return ["block"]
        return [name.split()[-1], color]  # "cue"/"door" and the colour

    @staticmethod
    def _letter(name: str, color: str | None) -> str:
        if name == "empty":
            return "."
        if name == "block":
            return "#"
        letter = COLORS[color][0]
        return letter if name == "cue" else letter.upper()

    def _legend(self, with_cue: bool) -> str:
        letters = [COLORS[color][0] for color in self.colors]
        palette = "/".join(self.colors)
        legend = "@ agent  # block  . floor  "
        if with_cue:
            legend += f"{'/'.join(letters)} cue ({palette})  "
        return legend + f"{'/'.join(x.upper() for x in letters)} door ({palette})"


class MazeBaseCore:
    """State and rules of a batch of MazeBase games, all advanced at once in NumPy.

    The map of game i is `cells[i]`; its agent stands on the flat index `position[i]` of
    `cells.reshape(-1)`. A subclass lays the map out and supplies the rules: `draw_bounds` (the
    random integers a reset needs, each below its bound), `_build` (the new maps from them),
    `_enter` (what entering a cell does), `episode_info` (what `info` reports at the end of an
    episode) and `_view` (one game's map).
    """

    draw_bounds: np.ndarray
    # The arrays that hold the games' state (the rest is layout and constants); a subclass
    # adds its own. `state_dict` saves them, e.g. so that a training run resumes exactly.
    state_arrays: tuple[str, ...] = ("cells", "position", "elapsed")

    cell_pixels = 16  # side of a cell in rgb_array frames

    def __init__(
        self,
        num_envs: int,
        cell_kinds: MazeBaseCells,
        cells_shape: tuple[int, ...],
        max_steps: int,
        extra_words: Sequence[str] = (),
    ) -> None:
        self.num_envs = check_int("num_envs", num_envs, 1)
        self.max_steps = check_int("max_steps", max_steps, 1)
        self.cell_kinds = cell_kinds
        self.cells = np.full((self.num_envs, *cells_shape), MazeBaseCells.BLOCK, dtype=np.uint8)
        self.flat_cells = self.cells.reshape(-1)  # a view: writes to `cells` show through
        self.env_start = np.arange(self.num_envs, dtype=np.int64) * math.prod(cells_shape)
        row_stride = cells_shape[-1]
        self.moves = np.array([-row_stride, 1, row_stride, -1], dtype=np.int64)
        self.window = WordWindow([*cell_kinds.vocab, *extra_words], cell_kinds.words, row_stride)
        self.position = np.zeros(self.num_envs, dtype=np.int64)
        self.elapsed = np.zeros(self.num_envs, dtype=np.int64)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the state arrays of every game."""
        return {name: getattr(self, name).copy() for name in self.state_arrays}

    def load_state_dict(self, saved: dict[str, np.ndarray]) -> None:
        """Continue the games saved by `state_dict` (written in place: views stay valid)."""
        for name in self.state_arrays:
            np.copyto(getattr(self, name), saved[name])

    def reset(self, env_ids: np.ndarray, rngs: Sequence[np.random.Generator]) -> None:
        """Start new games in `env_ids`, the k-th drawing its random numbers from `rngs[k]`."""
        # One generator call per game keeps every game's random stream its own; the rest of
        # the reset is vectorised over the games. floor(u * bound) is uniform below the bound
        # (the minimum guards against u * bound rounding up to the bound itself).
        uniform = np.stack([rng.random(self.draw_bounds.shape) for rng in rngs])
        draws = np.minimum((uniform * self.draw_bounds).astype(np.int64), self.draw_bounds - 1)
        self.elapsed[env_ids] = 0
        self._build(env_ids, draws)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Move every agent one cell; returns (reward, terminated, truncated) per game."""
        target = self.position + self.moves[actions]
        code = self.flat_cells[target]
        np.copyto(self.position, target, where=self.cell_kinds.enterable[code])
        reward, terminated = self._enter(code)
        self.elapsed += 1
        truncated = (self.elapsed >= self.max_steps) & ~terminated
        return reward, terminated, truncated

    def blocked_moves(self) -> np.ndarray:
        """(num_envs, 4) bool: which actions of each game would not move its agent now (a block,
        a cue, the map's edge), as `step` decides it."""
        targets = self.position[:, None] + self.moves
        return ~self.cell_kinds.enterable[self.flat_cells[targets]]

    def observe(self, env_ids: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        """Write the observations of `env_ids` (all games if None) into `out`."""
        centres = self.position if env_ids is None else self.position[env_ids]
        return self.window.observe(self.flat_cells, centres, out)

    def render(self, env_id: int, mode: str) -> str | np.ndarray:
        codes, agent, caption = self._view(env_id)
        if mode == "ansi":
            return rendering.text_picture(codes, agent, self.cell_kinds, caption)
        canvas_shape = self.cells.shape[-2:]  # every frame of a game has the same size
        return rendering.rgb_picture(codes, agent, self.cell_kinds, self.cell_pixels, canvas_shape)

    def episode_info(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _build(self, env_ids: np.ndarray, draws: np.ndarray) -> None:
        raise NotImplementedError

    def _enter(self, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rules for the cells the agents moved into: (reward, terminated) per game."""
        raise NotImplementedError

    def _view(self, env_id: int) -> tuple[np.ndarray, tuple[int, int], str]:
        """The 2-D codes of the part of the map to draw, the agent's (row, col) and a caption."""
        raise NotImplementedError


_FIRST = np.zeros(1, dtype=np.int64)  # the env ids of a core of one game


class MazeBaseEnv(gym.Env):
    """One MazeBase game as a Gymnasium environment: a view on a core of one game."""

    metadata = {"render_modes": RENDER_MODES, "render_fps": 8}
    core_class: type[MazeBaseCore]

    def __init__(self, render_mode: str | None = None, **game_kwargs: Any) -> None:
        check_render_mode(render_mode)
        self.core = self.core_class(num_envs=1, **game_kwargs)
        self.render_mode = render_mode
        self.observation_space = self.core.window.observation_space
        self.action_space = spaces.Discrete(len(ACTION_NAMES))
        self.vocab = self.core.window.vocab
        self.action_names = ACTION_NAMES
        self._obs = np.zeros((1, *self.observation_space.shape), dtype=np.uint8)
        self._episode_over = True

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.core.reset(_FIRST, [self.np_random])
        self._episode_over = False
        return self._observe(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self.action_space.contains(action):
            raise ValueError(f"action must be an integer in 0..3 ({ACTIONS_HELP}), got {action!r}")
        if self._episode_over:
            raise RuntimeError("the episode is over (or never started): call reset() first")
        reward, terminated, truncated = self.core.step(np.array([action], dtype=np.int64))
        self._episode_over = bool(terminated[0] or truncated[0])
        info = {}
        if self._episode_over:
            info = {key: value.item() for key, value in self.core.episode_info(_FIRST).items()}
        return self._observe(), float(reward[0]), bool(terminated[0]), bool(truncated[0]), info

    def render(self) -> str | np.ndarray | None:
        if self.render_mode is None:
            warn_no_render_mode()
            return None
        return self.core.render(0, self.render_mode)

    def _observe(self) -> np.ndarray:
        return self.core.observe(None, self._obs)[0].copy()
