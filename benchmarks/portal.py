"""Multi-Room Portal: agents with different memories at one budget, against scripted references.

    python benchmarks/portal.py --out runs/portal [--steps 20000000] [--agents ...]
        [--seeds 0 1 2] [--episodes 100] [--references-only]

References, measured here: `envs.demo.ScriptedPortalPolicy` with a memory of the doors it
tried (the most remembering earns) and without (a door at random on every visit), each over
``--episodes`` episodes of the default Portal (50 rooms of 5 x 5, 1000 steps).

Agents: `python train_rl.py env=portal` (the paper's settings: 1024 environments, Adam 5e-4,
L = 100) with each memory of ``--agents`` and each of ``--seeds``, ``--steps`` environment
steps each (20M: about an hour for Expire-Span on a 2-core CPU), one run at a time on every
core, in ``--out``/<agent>/seed<S> (metrics, checkpoints, and the greedy evaluation of
eval.json). A run that was stopped continues from its checkpoint when the command is given
again. The memories:
- ``expire_span``: Expire-Span, L = 100;
- ``transformer_xl_100`` and ``transformer_xl_10``: a fixed span of 100 and of 10 steps;
- ``span_1``: a fixed span of 1 step, an agent without a memory of the doors.

Prints one JSON object per reference and per run: {"policy", "return", "rooms_reached",
"memory_size"} (a run's from the mean of its last three logging intervals, with its "seed",
"steps" and greedy evaluation as "greedy_return" and "greedy_rooms_reached"); then, for an
agent of several seeds, the mean over its seeds and the lowest seed's figures ("lowest_*").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

import envs  # noqa: F401  (registers the environments)
from envs.demo import ScriptedPortalPolicy

ROOT = Path(__file__).resolve().parents[1]

AGENTS = {
    "expire_span": ["memory=expire_span"],
    "transformer_xl_100": ["memory=transformer_xl", "memory.max_span=100"],
    "transformer_xl_10": ["memory=transformer_xl", "memory.max_span=10"],
    "span_1": ["memory=transformer_xl", "memory.max_span=1"],
}
LAST_INTERVALS = 3
CHECKPOINT_INTERVAL = 10  # updates; a Portal update is 1024 x 100 steps, so about 1M steps


def scripted_reference(memory: bool, episodes: int, seed: int = 0) -> dict:
    """Mean return and rooms reached of the scripted explorer over ``episodes`` episodes."""
    env = gym.make("MazeBase/Portal-v0")
    policy = ScriptedPortalPolicy(env.unwrapped.vocab, memory, np.random.default_rng(seed))
    returns, rooms = [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        policy.reset()
        done, episode_return = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy.act(obs))
            done, episode_return = terminated or truncated, episode_return + reward
        returns.append(episode_return)
        rooms.append(info["rooms_reached"])
    name = "scripted, memory of the doors" if memory else "scripted, no memory"
    return {
        "policy": name,
        "return": round(float(np.mean(returns)), 2),
        "rooms_reached": round(float(np.mean(rooms)), 2),
        "memory_size": None,
    }


def train_agent(name: str, seed: int, out: Path, steps: int) -> dict:
    """Trains (or continues) agent ``name`` with ``seed`` in ``out``/``name``/seed<S>; its
    final figures."""
    run_dir = out / name / f"seed{seed}"
    resume = ["resume=true"] if (run_dir / "checkpoint.pt").exists() else []
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "train_rl.py"),
            "env=portal",
            *AGENTS[name],
            f"total_steps={steps}",
            f"seed={seed}",
            f"checkpoint_interval={CHECKPOINT_INTERVAL}",
            *resume,
            f"hydra.run.dir={run_dir}",
        ],
        check=True,
        cwd=ROOT,
    )
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    last = [line for line in lines if "rooms_reached" in line][-LAST_INTERVALS:]
    greedy = json.loads((run_dir / "eval.json").read_text())["greedy"]

    def mean(key: str) -> float:
        return round(float(np.mean([line[key] for line in last])), 2)

    return {
        "policy": name,
        "seed": seed,
        "steps": lines[-1]["step"],
        "return": mean("return"),
        "rooms_reached": mean("rooms_reached"),
        "memory_size": mean("memory_size"),
        "greedy_return": round(greedy["return"], 2),
        "greedy_rooms_reached": round(greedy["rooms_reached"], 2),
    }


FIGURES = ("return", "rooms_reached", "memory_size", "greedy_return", "greedy_rooms_reached")


def over_seeds(runs: list[dict]) -> dict:
    """An agent's figures over its runs: the mean of each, and the lowest of each but memory."""
    summary = {"policy": runs[0]["policy"], "seeds": [run["seed"] for run in runs]}
    for key in FIGURES:
        values = [run[key] for run in runs]
        summary[key] = round(float(np.mean(values)), 2)
        if key != "memory_size":
            summary[f"lowest_{key}"] = min(values)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/portal"), help="run directories")
    parser.add_argument("--steps", type=int, default=20_000_000, help="environment steps per agent")
    parser.add_argument("--agents", nargs="+", default=list(AGENTS), choices=AGENTS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="seeds per agent")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per reference")
    parser.add_argument("--references-only", action="store_true")
    args = parser.parse_args()
    for memory in (True, False):
        print(json.dumps(scripted_reference(memory, args.episodes)), flush=True)
    if args.references_only:
        return
    for name in args.agents:
        runs = []
        for seed in args.seeds:
            runs.append(train_agent(name, seed, args.out, args.steps))
            print(json.dumps(runs[-1]), flush=True)
        if len(runs) > 1:
            print(json.dumps(over_seeds(runs)), flush=True)


if __name__ == "__main__":
    main()
