"""Training steps per second of train_rl.py: acting, learning and logging, end to end.

    python benchmarks/rl_throughput.py [--steps 192000] [--kinds expire_span transformer_xl lstm]

Runs `train_rl.py` on Corridor (lengths 3..200, the paper's 2-layer, 64-unit agent) for each
learner (PPO with 32 environments, the default; the paper's A2C with 64) and memory kind, in
a fresh process each, and prints one JSON object per line:
{"learner", "memory", "num_envs", "steps_per_s", "memory_size"}, where steps_per_s is the
mean of the logged `sps` after the first logging interval (start-up excluded).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEARNERS = {"ppo": 32, "a2c": 64}  # learner -> number of environments


def measure(learner: str, kind: str, num_envs: int, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run(
            [
                sys.executable,
                str(ROOT / "train_rl.py"),
                f"agent={learner}",
                f"memory={kind}",
                f"num_envs={num_envs}",
                f"total_steps={steps}",
                "log_interval=5",
                "wandb.mode=disabled",
                f"hydra.run.dir={run_dir}",
            ],
            check=True,
            capture_output=True,
            cwd=ROOT,
        )
        lines = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]
    timed = lines[1:] or lines
    return {
        "learner": learner,
        "memory": kind,
        "num_envs": num_envs,
        "steps_per_s": round(sum(line["sps"] for line in timed) / len(timed)),
        "memory_size": round(lines[-1]["memory_size"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=192000, help="steps per configuration")
    parser.add_argument("--kinds", nargs="+", default=["expire_span", "transformer_xl", "lstm"])
    args = parser.parse_args()
    for learner, num_envs in LEARNERS.items():
        for kind in args.kinds:
            print(json.dumps(measure(learner, kind, num_envs, args.steps)), flush=True)


if __name__ == "__main__":
    main()
