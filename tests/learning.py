"""Learning that must happen on most seeds, not on one seed's trajectory: train_rl.py runs of
several seeds at once (one thread each), judged run by run, with every curve in the message of
a failure. A seed's trajectory changes with the CPU's kernels (AVX2 or AVX-512); whether most
seeds learn does not."""

import json
import subprocess
import sys
from pathlib import Path

from scripts import script_env

ROOT = Path(__file__).resolve().parents[1]


def train_on_seeds(args: list[str], seeds: tuple[int, ...], root: Path) -> dict[int, list[dict]]:
    """The metrics lines of one `train_rl.py ARGS seed=S` run per seed, run side by side."""
    env = script_env()
    runs = {}
    for seed in seeds:
        command = [sys.executable, str(ROOT / "train_rl.py"), *args, f"seed={seed}"]
        command.append(f"hydra.run.dir={root / f'seed{seed}'}")
        runs[seed] = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    for seed, process in runs.items():
        _, stderr = process.communicate(timeout=1200)
        assert process.returncode == 0, f"seed {seed}: {stderr.decode()}"
    return {
        seed: [json.loads(line) for line in (root / f"seed{seed}" / "metrics.jsonl").open()]
        for seed in seeds
    }


def curves(lines: dict[int, list[dict]], key: str) -> str:
    """Every seed's whole curve of ``key``, for an assertion's message."""
    return "; ".join(
        f"seed {seed}: " + " ".join(f"{line['step']}:{line[key]:.3f}" for line in run)
        for seed, run in lines.items()
    )
