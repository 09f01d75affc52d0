"""The numbers a refactor must not change: a short RL run and a short LM run with fixed seeds
write the metrics kept in tests/golden/ (timing aside). Regenerate them only for a change
meant to change results: `python tests/test_golden.py`, and say why in the commit."""

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from tiny_rl import STEPS_PER_UPDATE, TINY_RL

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
            "eval_tokens=1024",
            "warmup_steps=2",
            "total_steps=12",
            "log_interval=2",
            "eval_interval=6",
            "seed=3",
        ],
    ),
}


def metrics_of(name: str, run_dir: Path) -> list[dict]:
    script, args = RUNS[name]
    common = ["wandb.mode=disabled", "eval.after_training=false", "torch_threads=1"]
    if name == "lm":
        common.append(f"task.cache_dir={run_dir / 'cache'}")
    result = subprocess.run(
        [sys.executable, str(ROOT / script), *args, *common, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def close(value, expected) -> bool:
    if isinstance(expected, float) and isinstance(value, float):
        return math.isclose(value, expected, rel_tol=RELATIVE_TOLERANCE, abs_tol=ABSOLUTE_TOLERANCE)
    return value == expected


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_short_run_writes_the_kept_metrics(tmp_path, name):
    expected = json.loads((GOLDEN / f"{name}_metrics.json").read_text())
    logged = metrics_of(name, tmp_path / "run")
    assert [sorted(line) for line in logged] == [sorted(line) for line in expected]
    for line, kept in zip(logged, expected, strict=True):
        differ = {k: (line[k], kept[k]) for k in kept if not close(line[k], kept[k])}
        assert not differ, f"step {kept['step']}: (now, kept) {differ}"


if __name__ == "__main__":  # regenerate the kept metrics
    GOLDEN.mkdir(exist_ok=True)
    for name in RUNS:
        with tempfile.TemporaryDirectory() as tmp:
            logged = metrics_of(name, Path(tmp) / "run")
        (GOLDEN / f"{name}_metrics.json").write_text(json.dumps(logged, indent=1) + "\n")
        print(f"{GOLDEN / f'{name}_metrics.json'}: {len(logged)} lines")
