"""Environment steps per second: the batched Corridor and Portal cores against MiniGrid.

    python benchmarks/env_throughput.py [--seconds 2] [--num-envs 1 64 1024]

Prints one JSON object per line, {"env", "num_envs", "steps_per_s"}: Corridor and Portal built
with `gymnasium.make_vec(..., vectorization_mode="vector_entry_point")` (random actions,
autoreset in the same step, as training runs them), then MiniGrid's MemoryS13Random (random
actions, reset when an episode ends), for scale: plain `gymnasium.make`, the word-window wrapper
around it (`"wrapped": "plain"`), and the wrapper as training makes it, which builds MiniGrid's
agent view at resets only (`"wrapped": "view at resets"`).
"""

from __future__ import annotations

import argparse
import json
import time

import gymnasium as gym
import minigrid  # noqa: F401  (registers MiniGrid's environments)
import numpy as np
from gymnasium.vector import AutoresetMode

import envs  # (registers the MazeBase environments)

MAZEBASE_IDS = ("MazeBase/Corridor-v0", "MazeBase/Portal-v0")
MINIGRID_ID = "MiniGrid-MemoryS13Random-v0"


def batched_steps_per_s(env_id: str, num_envs: int, seconds: float) -> float:
    env = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="vector_entry_point",
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 4, size=(256, num_envs))
    for step in range(20):  # warm-up
        env.step(actions[step])
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for step_actions in actions:
            env.step(step_actions)
        steps += len(actions)
    return steps * num_envs / (time.perf_counter() - start)


def minigrid_steps_per_s(env: gym.Env, seconds: float) -> float:
    env.reset(seed=0)
    env.action_space.seed(0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(100):
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()
        steps += 100
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 1024])
    args = parser.parse_args()
    for env_id in MAZEBASE_IDS:
        for num_envs in args.num_envs:
            rate = batched_steps_per_s(env_id, num_envs, args.seconds)
            print(json.dumps({"env": env_id, "num_envs": num_envs, "steps_per_s": round(rate)}))
    minigrid_envs = {
        None: gym.make(MINIGRID_ID),
        "plain": envs.MiniGridMemoryWrapper(gym.make(MINIGRID_ID)),
        "view at resets": envs.make_minigrid_memory(MINIGRID_ID),
    }
    for wrapped, env in minigrid_envs.items():
        rate = minigrid_steps_per_s(env, args.seconds)
        row = {"env": MINIGRID_ID, "num_envs": 1, "steps_per_s": round(rate)}
        print(json.dumps(row if wrapped is None else {**row, "wrapped": wrapped}))


if __name__ == "__main__":
    main()
