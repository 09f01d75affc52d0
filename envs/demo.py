"""Watch a Corridor episode in the terminal: `python -m envs.demo --seed 3`.

The scripted policy reads only its observations: it remembers the cue's colour, walks east and
takes the door of that colour. `--policy random` moves at random instead. `ScriptedPortalPolicy`
explores Portal the same way, with or without a memory of the doors it tried: the references
an agent's memory is measured against (`benchmarks/portal.py`).
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np

import envs  # noqa: F401  (registers the environments)

UP, RIGHT, DOWN = 0, 1, 2


class ScriptedCorridorPolicy:
    """Remembers the colour of the cue it sees, walks east, goes through the door of that colour."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = vocab
        self.colors = {word for word in vocab if word not in ("agent", "block", "cue", "door")}
        self.cue_color: str | None = None

    def reset(self) -> None:
        self.cue_color = None

    def act(self, obs: np.ndarray) -> int:
        for cell in obs.reshape(-1, obs.shape[-1]):
            words = self._words(cell)
            if "cue" in words:
                (self.cue_color,) = words & self.colors
        for action, row in ((UP, 0), (DOWN, 2)):
            door = self._words(obs[row, 1])
            if "door" in door and self.cue_color in door:
                return action
        return RIGHT

    def _words(self, cell: np.ndarray) -> set[str]:
        return {self.vocab[i] for i in np.flatnonzero(cell)}


class ScriptedPortalPolicy:
    """Walks east in every room, finds the doors along the east wall and goes through one.

    With ``memory`` it remembers, per room, the colour of the door it went through and whether
    that led on (the room word after it is the next room's) or back to the first room, and then
    always takes the good door: the most a memory of the doors can earn. Without, it picks one
    of a room's two doors at random on every visit, forgetting what it tried. Both read only
    their observations (the room word on the agent's cell, doors and walls in view).
    """

    def __init__(self, vocab: list[str], memory: bool, rng: np.random.Generator) -> None:
        self.vocab = vocab
        self.memory = memory
        self.rng = rng
        rooms = ((i, word) for i, word in enumerate(vocab) if word.startswith("room_"))
        self.room_words = {i: int(word.removeprefix("room_")) for i, word in rooms}
        self.good: dict[int, str] = {}  # room -> colour of its good door (with memory)
        self.bad: dict[int, str] = {}  # room -> colour of its bad door (with memory)
        self.reset()

    def reset(self) -> None:
        self.good.clear()
        self.bad.clear()
        self.room: int | None = None
        self.taken: str | None = None  # the colour of the door just stepped into
        self.first_seen: str | None = None  # this visit: the first door colour seen ...
        self.take_first = True  # ... and whether to take it (memoryless: a coin flip)
        self.sweep = UP

    def act(self, obs: np.ndarray) -> int:
        room = self._room(obs)
        # through a door is always a new visit (a bad door of the first room leads back into it)
        if room != self.room or self.taken is not None:
            self._entered(room)
        if not self._words(obs[1, 2]):  # floor ahead: walk to the east wall
            return RIGHT
        doors = {row: self._door_color(obs[row, 2]) for row in range(3)}
        doors = {row: color for row, color in doors.items() if color is not None}
        if self.first_seen is None and doors:
            self.first_seen = doors[min(doors)]
        for row, color in doors.items():
            if self._wanted(color):
                if row == 1:
                    self.taken = color
                    return RIGHT
                return UP if row == 0 else DOWN
        if "block" in self._words(obs[0 if self.sweep == UP else 2, 1]):
            self.sweep = DOWN if self.sweep == UP else UP
        return self.sweep

    def _entered(self, room: int) -> None:
        """A new room (or the first room again): learn from the door taken, start a visit."""
        if self.memory and self.taken is not None and self.room is not None:
            if room == self.room + 1:
                self.good[self.room] = self.taken
            else:
                self.bad[self.room] = self.taken
        self.room, self.taken, self.first_seen, self.sweep = room, None, None, UP
        self.take_first = self.memory or bool(self.rng.integers(2))

    def _wanted(self, color: str) -> bool:
        if self.memory and self.room in self.good:
            return color == self.good[self.room]
        if self.memory and self.room in self.bad:
            return color != self.bad[self.room]
        return (color == self.first_seen) == self.take_first

    def _room(self, obs: np.ndarray) -> int:
        centre = np.flatnonzero(obs[1, 1])
        return next(self.room_words[i] for i in centre if i in self.room_words)

    def _door_color(self, cell: np.ndarray) -> str | None:
        words = self._words(cell)
        if "door" not in words:
            return None
        (color,) = words - {"door"}
        return color

    def _words(self, cell: np.ndarray) -> set[str]:
        return {self.vocab[i] for i in np.flatnonzero(cell)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy", choices=("scripted", "random"), default="scripted")
    parser.add_argument("--min-length", type=int, default=3)
    parser.add_argument("--max-length", type=int, default=12)
    args = parser.parse_args()

    env = gym.make(
        "MazeBase/Corridor-v0",
        min_length=args.min_length,
        max_length=args.max_length,
        render_mode="ansi",
    )
    policy = ScriptedCorridorPolicy(env.unwrapped.vocab)
    env.action_space.seed(args.seed)
    obs, _ = env.reset(seed=args.seed)
    print(env.render())
    episode_return, done = 0.0, False
    while not done:
        action = policy.act(obs) if args.policy == "scripted" else env.action_space.sample()
        obs, reward, terminated, truncated, info = env.step(action)
        episode_return += reward
        done = terminated or truncated
        print(f"action {action} ({env.unwrapped.action_names[action]})  reward {reward}")
        print(env.render())
    outcome = "success" if info["success"] else "failure"
    ending = "went through a door" if terminated else "ran out of steps"
    print(f"{outcome}: the agent {ending}; return {episode_return}")


if __name__ == "__main__":
    main()
