"""Corridor (Expire-Span paper, section 5.2 and appendix A.3.1): remember a colour.

The agent starts at the west end of a long corridor next to a red or blue cue and must walk
through the door of the cue's colour at the east end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envs.mazebase import MazeBaseCells, MazeBaseCore, MazeBaseEnv, check_int
from envs.vector import MazeBaseVectorEnv

# Rows of a game's map (the corridor and a row of blocks either side, plus one row of padding
# so that the window around a door stays on the map); column 0 is the block west of the start.
CUE_ROW, CORRIDOR_ROW, SOUTH_DOOR_ROW = 1, 2, 3
NORTH_DOOR_ROW = CUE_ROW
START_COL = 1
PLACES = ("start", "corridor", "end")  # `CorridorCore.places`: where in the corridor an agent is


class CorridorCore(MazeBaseCore):
    """The state and rules of a batch of Corridor games (see `CorridorEnv`)."""

    state_arrays = (*MazeBaseCore.state_arrays, "length", "cue_color", "good_door_north")

    def __init__(
        self,
        num_envs: int,
        min_length: int = 3,
        max_length: int = 200,
        max_steps: int | None = None,
        colors: Sequence[str] = ("red", "blue"),
    ) -> None:
        self.min_length = check_int("min_length", min_length, 2, " (a start cell and a door cell)")
        self.max_length = check_int(
            "max_length", max_length, self.min_length, f" (min_length={self.min_length})"
        )
        if max_steps is None:
            max_steps = 2 * self.max_length
        check_int("max_steps", max_steps, self.max_length, " (max_length: the longest corridor)")
        cell_kinds = MazeBaseCells(colors, with_cue=True)
        super().__init__(num_envs, cell_kinds, (5, self.max_length + 2), max_steps)
        num_colors = len(cell_kinds.colors)
        # length, cue colour, the other door's colour as a shift from the cue's, good door north?
        num_lengths = self.max_length - self.min_length + 1
        self.draw_bounds = np.array([num_lengths, num_colors, num_colors - 1, 2])
        self.length = np.zeros(self.num_envs, dtype=np.int64)
        self.cue_color = np.zeros(self.num_envs, dtype=np.int64)  # index into cell_kinds.colors
        self.good_door_north = np.zeros(self.num_envs, dtype=bool)
        self._columns = np.arange(self.cells.shape[-1])

    def episode_info(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        return {
            "success": self.cell_kinds.is_good_door[self.flat_cells[self.position[env_ids]]],
            "corridor_length": self.length[env_ids].copy(),
            "cue_color": self.cue_color[env_ids].copy(),
            "good_door_north": self.good_door_north[env_ids].copy(),
        }

    def _build(self, env_ids: np.ndarray, draws: np.ndarray) -> None:
        kinds = self.cell_kinds
        length = self.min_length + draws[:, 0]
        cue = draws[:, 1]
        other = (cue + 1 + draws[:, 2]) % len(kinds.colors)
        good_north = draws[:, 3] == 0
        east_end = START_COL + length - 1
        corridor = (self._columns >= START_COL) & (self._columns <= east_end[:, None])
        self.cells[env_ids] = kinds.BLOCK
        self.cells[env_ids, CORRIDOR_ROW] = np.where(corridor, kinds.EMPTY, kinds.BLOCK)
        self.cells[env_ids, CUE_ROW, START_COL] = kinds.cue[cue]
        good, bad = kinds.good_door[cue], kinds.bad_door[other]
        self.cells[env_ids, NORTH_DOOR_ROW, east_end] = np.where(good_north, good, bad)
        self.cells[env_ids, SOUTH_DOOR_ROW, east_end] = np.where(good_north, bad, good)
        self.length[env_ids] = length
        self.cue_color[env_ids] = cue
        self.good_door_north[env_ids] = good_north
        row_stride = self.cells.shape[-1]
        self.position[env_ids] = self.env_start[env_ids] + CORRIDOR_ROW * row_stride + START_COL

    def places(self) -> np.ndarray:
        """Where each agent stands: PLACES' index of the start cell beside the cue, a cell of
        the corridor between, or its east end before the doors (a corridor of length 2 has no
        cell between)."""
        column = (self.position - self.env_start) % self.cells.shape[-1]
        east_end = START_COL + self.length - 1
        return np.where(column == START_COL, 0, np.where(column == east_end, 2, 1))

    def _enter(self, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.cell_kinds.is_good_door[code].astype(np.float64), self.cell_kinds.is_door[code]

    def _view(self, env_id: int) -> tuple[np.ndarray, tuple[int, int], str]:
        length = int(self.length[env_id])
        agent = divmod(int(self.position[env_id] - self.env_start[env_id]), self.cells.shape[-1])
        _, cue_color = self.cell_kinds.kinds[self.cells[env_id, CUE_ROW, START_COL]]
        step = f"step {self.elapsed[env_id]}/{self.max_steps}"
        caption = f"Corridor  length {length}  cue {cue_color}  {step}"
        return self.cells[env_id, :, : START_COL + length + 1], agent, caption


class CorridorEnv(MazeBaseEnv):
    """A one-cell-wide corridor of `length` ~ U(min_length, max_length) cells running west to
    east, drawn anew at every reset, with blocks all around.

    - The agent starts on the westernmost corridor cell. The cue, `cue` plus a colour drawn
      from `colors` (red or blue by default), sits in the cell directly north of the start: it
      is in the first observation (`obs[0, 1]`), still in view after one step east
      (`obs[0, 0]`) and out of sight from the second step east on. The cue is solid: moving
      into it, like into a block, leaves the agent where it is.
    - The easternmost corridor cell has one door directly north and one directly south: one of
      the cue's colour, one of another colour of the palette, which is north drawn at random.
    - Stepping into a door ends the episode (terminated) with reward 1 if its colour is the
      cue's, else 0; the last observation shows the agent on the door. All other steps pay 0.
    - After `max_steps` steps the episode is truncated. The default, 2 * max_length, is twice
      what an agent walking straight east needs for the longest corridor (length steps);
      `max_steps` below `max_length` is refused since the longest corridors could not be won.
    - `info["success"]` (bool), at the last step of every episode: the agent went through the
      door of the cue's colour (False when truncated); with it the episode's layout:
      `corridor_length`, `cue_color` (an index into `colors`) and `good_door_north` (bool).

    `min_length` may go down to 2 (a start cell and a door cell); the paper uses 3..200.
    Observation words: agent, block, cue, door and the palette's colours (`vocab`).

    Keyword arguments: `min_length` (3), `max_length` (200), `max_steps` (None: 2 * max_length),
    `colors` (("red", "blue")), `render_mode` (None, "ansi" or "rgb_array").
    """

    core_class = CorridorCore


class CorridorVectorEnv(MazeBaseVectorEnv):
    """`num_envs` Corridor games stepped at once (see `CorridorEnv` and `MazeBaseVectorEnv`)."""

    core_class = CorridorCore
