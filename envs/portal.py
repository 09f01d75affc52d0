"""Multi-Room Portal (Expire-Span paper, section 5.2 and appendix A.3.1): remember a sequence.

Rooms are chained by pairs of doors; in each room one door leads on and the other back to the
first room, and only trial and error (and memory) tells them apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envs import rendering
from envs.mazebase import MazeBaseCells, MazeBaseCore, MazeBaseEnv, check_int
from envs.vector import MazeBaseVectorEnv

PORTAL_COLORS = ("red", "green", "blue", "yellow", "purple", "orange")


class PortalCore(MazeBaseCore):
    """The state and rules of a batch of Portal games (see `PortalEnv`).

    The map of a game is `cells[game, room]`, one (room_size + 2)-square room with its walls per
    room; `mistakes[game, room]` counts the wrong doors taken in each room.
    """

    cell_pixels = 32
    state_arrays = (*MazeBaseCore.state_arrays, "room", "rooms_reached", "mistakes")

    def __init__(
        self,
        num_envs: int,
        num_rooms: int = 50,
        room_size: int = 5,
        max_steps: int = 1000,
        colors: Sequence[str] = PORTAL_COLORS,
    ) -> None:
        self.num_rooms = check_int("num_rooms", num_rooms, 2, " (a first and a last room)")
        self.room_size = check_int("room_size", room_size, 2, " (two doors on distinct rows)")
        cell_kinds = MazeBaseCells(colors, with_cue=False)
        side = self.room_size + 2
        room_words = [f"room_{k}" for k in range(self.num_rooms)]
        super().__init__(num_envs, cell_kinds, (self.num_rooms, side, side), max_steps, room_words)
        self._room_stride = side * side
        self._entry = (1 + (self.room_size - 1) // 2) * side + 1  # middle of the west side
        self._room_template = np.full((side, side), cell_kinds.BLOCK, dtype=np.uint8)
        self._room_template[1:-1, 1:-1] = cell_kinds.EMPTY
        self._first_room_word = self.window.word_index("room_0")
        num_colors = len(cell_kinds.colors)
        # Per room: a door's row, the other's as a shift from it, the same for their colours,
        # and whether the first door is the good one.
        bounds = [self.room_size, self.room_size - 1, num_colors, num_colors - 1, 2]
        self.draw_bounds = np.tile(bounds, (self.num_rooms, 1))
        self.room = np.zeros(self.num_envs, dtype=np.int64)
        self.rooms_reached = np.zeros(self.num_envs, dtype=np.int64)
        self.mistakes = np.zeros((self.num_envs, self.num_rooms), dtype=np.uint8)

    def observe(self, env_ids: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        """The word window plus the current room's word on the agent's cell."""
        super().observe(env_ids, out)
        rooms = self.room if env_ids is None else self.room[env_ids]
        centre = self.window.size // 2
        out[np.arange(len(rooms)), centre, centre, self._first_room_word + rooms] = 1
        return out

    def episode_info(self, env_ids: np.ndarray) -> dict[str, np.ndarray]:
        reached = self.rooms_reached[env_ids]
        return {"rooms_reached": reached, "success": reached == self.num_rooms}

    def render(self, env_id: int, mode: str) -> str | np.ndarray:
        """The current room; in rgb_array a bar below it shows the rooms reached (grey) and
        the current room (white tick) out of all rooms."""
        frame = super().render(env_id, mode)
        if mode == "ansi":
            return frame
        reached = self.rooms_reached[env_id] / self.num_rooms
        current = (self.room[env_id] + 0.5) / self.num_rooms
        bar = rendering.progress_bar(frame.shape[1], self.cell_pixels // 2, reached, current)
        return np.concatenate([frame, bar])

    def _build(self, env_ids: np.ndarray, draws: np.ndarray) -> None:
        kinds = self.cell_kinds
        first_row = draws[..., 0]
        second_row = (first_row + 1 + draws[..., 1]) % self.room_size
        first_color = draws[..., 2]
        second_color = (first_color + 1 + draws[..., 3]) % len(kinds.colors)
        first_good = draws[..., 4] == 0
        first = np.where(first_good, kinds.good_door[first_color], kinds.bad_door[first_color])
        second = np.where(first_good, kinds.bad_door[second_color], kinds.good_door[second_color])
        games, rooms, east_wall = env_ids[:, None], np.arange(self.num_rooms), self.room_size + 1
        self.cells[env_ids] = self._room_template
        self.cells[games, rooms, 1 + first_row, east_wall] = first
        self.cells[games, rooms, 1 + second_row, east_wall] = second
        self.room[env_ids] = 0
        self.rooms_reached[env_ids] = 1
        self.mistakes[env_ids] = 0
        self.position[env_ids] = self.env_start[env_ids] + self._entry

    def _enter(self, code: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        reward = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        through = np.flatnonzero(self.cell_kinds.is_door[code])
        if through.size == 0:
            return reward, terminated
        good = self.cell_kinds.is_good_door[code[through]]
        room = self.room[through]
        reward[through] = np.where(good, 0.1 * (room + 1), 0.0)  # 0.1k from room k to k+1
        self.mistakes[through[~good], room[~good]] += 1
        second_mistake = ~good & (self.mistakes[through, room] >= 2)
        new_room = np.where(good, room + 1, 0)
        self.room[through] = new_room
        self.rooms_reached[through] = np.maximum(self.rooms_reached[through], new_room + 1)
        self.position[through] = (
            self.env_start[through] + new_room * self._room_stride + self._entry
        )
        terminated[through] = second_mistake | (new_room == self.num_rooms - 1)
        return reward, terminated

    def _view(self, env_id: int) -> tuple[np.ndarray, tuple[int, int], str]:
        room = int(self.room[env_id])
        local = int(self.position[env_id] - self.env_start[env_id]) - room * self._room_stride
        agent = divmod(local, self.room_size + 2)
        caption = (
            f"Portal  room_{room} of {self.num_rooms}  rooms reached {self.rooms_reached[env_id]}"
            f"  mistakes here {self.mistakes[env_id, room]}"
            f"  step {self.elapsed[env_id]}/{self.max_steps}"
        )
        return self.cells[env_id, room], agent, caption


class PortalEnv(MazeBaseEnv):
    """`num_rooms` rooms of `room_size` x `room_size` cells inside their walls, one after the
    other; only the current room is on the map the agent walks in.

    - The agent enters every room on the middle cell of its west side (the upper-middle one
      when `room_size` is even), at reset in the first room.
    - Each room's east wall holds two doors, on two distinct rows drawn at random, with two
      distinct colours drawn from `colors`. One of them, drawn at random, is the good door;
      rooms, rows, colours and good doors are drawn at reset and fixed for the episode. Nothing
      in the observation tells the good door from the other.
    - Stepping into the good door of room k (counted from 1) pays 0.1k and teleports the agent
      into room k + 1; the other door pays 0 and teleports it back into the first room (also
      from the first room). A door is never stood on.
    - The episode ends (terminated) when the agent reaches the last room, or takes the wrong
      door of a room for the second time in the episode (it is teleported to the first room
      first, which the last observation shows). It is truncated after `max_steps` steps.
    - Words: agent, block, door, the palette's colours, and `room_k` (k = 0 .. num_rooms - 1,
      the current room) on the agent's cell.
    - At the last step of every episode, `info["rooms_reached"]` (int) is the number of the
      furthest room the agent entered, counting the first room as 1: 1 if it never got through
      a good door, `num_rooms` if it reached the last room. `info["success"]` (bool) is whether
      it reached the last room.

    Keyword arguments: `num_rooms` (50), `room_size` (5), `max_steps` (1000), `colors` (six
    colours, `PORTAL_COLORS`), `render_mode` (None, "ansi" or "rgb_array"). The paper trains
    with discount 0.98.
    """

    core_class = PortalCore


class PortalVectorEnv(MazeBaseVectorEnv):
    """`num_envs` Portal games stepped at once (see `PortalEnv` and `MazeBaseVectorEnv`)."""

    core_class = PortalCore
