"""The numbers a refactor must not change: short RL and LM runs with fixed seeds write the
metrics kept in tests/golden/ (timing aside); the RL runs also their evaluation (eval.json)
and, for the Corridor, a recorded episode (`mode=eval eval.record=...txt`). Regenerate them
only for a change meant to change results: `python tests/test_golden.py`, and say why in the
commit."""

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from tiny_rl import STEPS_PER_UPDATE, TINY_RL, TINY_RUN

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
TIMING = ("sps", "tokens_per_s")
# Float kernels differ between CPUs (AVX2, AVX-512) in their last bits; over a few updates
# that moved the RL losses by up to 4e-5 relative (1e-7 absolute: means of small terms that
# cancel), far below these, while any change to what is computed is far above them.
RELATIVE_TOLERANCE = 1e-3
ABSOLUTE_TOLERANCE = 1e-6

RUNS = {
    "rl": (
        "train_rl.py",
        [*TINY_RL, "seed=3", "log_interval=2", f"total_steps={6 * STEPS_PER_UPDATE}"],
    ),
    # A2C and a GRU on an env that resets in the next step and truncates at a step limit
    "rl_gym": (
        "train_rl.py",
        [
            *TINY_RUN,
            "env=gym",
            "env.id=CartPole-v1",
            "env.max_episode_steps=12",
            "agent=a2c",
            "memory=gru",
            "memory.dim=16",
            "seed=3",
            "log_interval=2",
            f"total_steps={6 * STEPS_PER_UPDATE}",
            "eval.episodes=6",
            "eval.num_envs=4",
        ],
    ),
    "lm": (
        "train_lm.py",
        [
            "task=copy",
            "task.distance=8",
            "task.train_episodes=400",
            "task.valid_episodes=64",
            "memory.dim=32",
            "memory.num_heads=2",
            "memory.ffn_dim=64",
            "memory.block_len=16",
            "memory.max_span=32",
            "batch_size=4",
            "eval_batch_size=4",
            "valid_prefix=1024",
            "warmup_steps=2",
            "total_steps=12",
            "log_interval=2",
            "eval_interval=6",
            "seed=3",
        ],
    ),
}


RECORDED = "rl"  # the run whose trained agent also records an episode


# one thread, and the CPU: the kept outputs are the CPU's (a GPU's kernels round differently)
PINNED = ["wandb.mode=disabled", "torch_threads=1", "device=cpu"]


def run_script(script: str, args: list[str]) -> str:
    result = subprocess.run(
        [sys.executable, str(ROOT / script), *args, *PINNED],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def outputs_of(name: str, run_dir: Path) -> dict[str, Any]:
    """What the run ``name`` writes: its metrics lines (timing aside) and, for RL, its
    eval.json and the recorded episode's text."""
    script, args = RUNS[name]
    common = [f"hydra.run.dir={run_dir}"]
    if name == "lm":
        common += [f"task.cache_dir={run_dir / 'cache'}", "eval.after_training=false"]
    run_script(script, [*args, *common])
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    outputs = {
        "metrics": [
            {k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines
        ]
    }
    if name != "lm":
        outputs["eval"] = json.loads((run_dir / "eval.json").read_text())
    if name == RECORDED:
        trace = run_dir / "episode.txt"
        evaluation = [
            "mode=eval",
            f"checkpoint={run_dir}",
            f"eval.record={trace}",
            "eval.episodes=4",
        ]
        outputs["eval_mode"] = json.loads(run_script("train_rl.py", evaluation))
        del outputs["eval_mode"]["checkpoint"], outputs["eval_mode"]["record"]  # (paths)
        outputs["recorded"] = trace.read_text()
    return outputs


def differences(value: Any, kept: Any, where: str = "") -> list[str]:
    """Where ``value`` differs from ``kept``: floats beyond the tolerances, anything else."""
    if isinstance(kept, dict) and isinstance(value, dict) and sorted(kept) == sorted(value):
        return [d for key in kept for d in differences(value[key], kept[key], f"{where}/{key}")]
    if isinstance(kept, list) and isinstance(value, list) and len(kept) == len(value):
        return [
            d
            for i, pair in enumerate(zip(value, kept, strict=True))
            for d in differences(*pair, f"{where}/{i}")
        ]
    if isinstance(kept, float) and isinstance(value, float | int):
        if math.isclose(value, kept, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE):
            return []
    elif value == kept:
        return []
    return [f"{where}: now {value!r}, kept {kept!r}"[:300]]


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.slow
def test_a_short_run_writes_the_kept_outputs(tmp_path, name):
    kept = json.loads((GOLDEN / f"{name}.json").read_text())
    differ = differences(outputs_of(name, tmp_path / "run"), kept)
    assert not differ, "\n".join(differ[:20])


if __name__ == "__main__":  # regenerate the kept outputs
    GOLDEN.mkdir(exist_ok=True)
    for name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            outputs = outputs_of(name, Path(tmp) / "run")
        (GOLDEN / f"{name}.json").write_text(json.dumps(outputs, indent=1) + "\n")
        print(f"{GOLDEN / f'{name}.json'}: {len(outputs['metrics'])} lines")
