"""Watch a Corridor episode in the terminal: `python -m envs.demo --seed 3`.

The scripted policy reads only its observations: it remembers the cue's colour, walks east and
takes the door of that colour. `--policy random` moves at random instead.
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
