"""Expire-Span against Transformer-XL on the language-model tasks, at equal training steps.

    python benchmarks/lm_compare.py [--tasks text collision copy] [--kinds expire_span]
                                    [--steps 1000] [--seed 0] [--jobs 2] [--out runs/lm-compare]

Trains each task's runs (a memory kind and its maximum span L) with train_lm.py, each with
the lm.yaml model (4 layers, 128 units, blocks of 128 tokens, 16 streams) unless the task
below says otherwise, in OUT/TASK-KIND-L, and prints one JSON object per run: the final
validation metric, the average memory size |C_t| in training and in validation, training
tokens/s, wall-clock seconds and the exact command. `--kinds` keeps the runs of those
kinds; `--jobs 2` trains two models side by side (one core each).

- text: bits per byte on the Python documentation that every CPython ships
  (pydoc_data.topics, written out as plain text, ~470 kB); Expire-Span L = 1024 against
  Transformer-XL L = 256.
- collision: the hard Object Collision task (A.3.3) with its task-file sizes, scored by
  error over the whole validation split (chance: 0.75, less the quadrants' imbalance);
  Expire-Span L = 4096 against Transformer-XL L = 512. Each run also prints the errors of two
  answers that learn nothing on the same split: the best constant quadrant
  (valid_constant_error) and the last collision's quadrant (valid_last_collision_error).
- copy: distance 64, counts 1..4 (chance 0.25), a 2-layer model: Transformer-XL L = 16
  sees 2 x 16 = 32 < 64 tokens back, Expire-Span L = 256 can keep the A's, and
  Transformer-XL L = 128 sees them all (the full-memory reference). Blocks of 128
  tokens: relative positions reach block_len - 1 tokens back only (A.1), and a model must
  place the A's, up to 64 + 2 x 4 = 72 tokens back. With blocks of 32 or 64 even
  Transformer-XL L = 128 stays at the loss of a model that does not count (0.48) and
  accuracy 0, while with blocks of 80 or 128 it reaches 0.98 (the first answer of each
  validation row has its A's in the row before, or no `.` before them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_CORPUS = "python_docs.txt"
BASELINES = ("valid_constant_error", "valid_last_collision_error")  # logged by collision runs

TASKS: dict[str, dict] = {
    "text": {
        "metric": "valid_bpb",
        "task": ["task=text", "task.path={corpus}"],
        "runs": [("expire_span", 1024), ("transformer_xl", 256)],
    },
    "collision": {
        "metric": "valid_error",
        "task": ["task=collision", "valid_prefix=null", "task.cache_dir={out}/cache"],
        "runs": [("expire_span", 4096), ("transformer_xl", 512)],
    },
    "copy": {
        "metric": "valid_accuracy",
        "task": [
            "task=copy",
            "task.cache_dir={out}/cache",
            "memory.num_layers=2",
            "memory.block_len=128",
            "memory.init_span_fraction=0.5",
        ],
        "runs": [("expire_span", 256), ("transformer_xl", 16), ("transformer_xl", 128)],
    },
}


def write_corpus(path: Path) -> Path:
    """Python's own documentation topics (the text `help("topic")` shows) as one text file."""
    from pydoc_data.topics import topics

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(topics[name] for name in sorted(topics)), encoding="utf-8")
    return path


def planned_runs(tasks: list[str], kinds: list[str]) -> list[tuple[str, str, int]]:
    """(task, kind, span) for each run of `tasks` whose memory kind is in `kinds`."""
    return [
        (task, kind, span) for task in tasks for kind, span in TASKS[task]["runs"] if kind in kinds
    ]


def run_name(task: str, kind: str, span: int) -> str:
    """The run's directory under --out and its "run" in the JSON, e.g. copy-transformer_xl-128."""
    return f"{task}-{kind}-{span}"


def train_command(
    task: str, kind: str, span: int, steps: int, seed: int, out: Path, corpus: Path
) -> list[str]:
    overrides = [arg.format(out=out, corpus=corpus) for arg in TASKS[task]["task"]]
    return [
        sys.executable,
        str(ROOT / "train_lm.py"),
        *overrides,
        f"memory={kind}",
        f"memory.max_span={span}",
        f"seed={seed}",
        f"total_steps={steps}",
        f"eval_interval={max(1, steps // 2)}",
        f"checkpoint_interval={steps}",
        "wandb.mode=disabled",
        f"hydra.run.dir={out / run_name(task, kind, span)}",
    ]


def train(task: str, kind: str, span: int, steps: int, seed: int, out: Path, corpus: Path) -> dict:
    command = train_command(task, kind, span, steps, seed, out, corpus)
    started = time.perf_counter()
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-2000:]}")
    records = [
        json.loads(line) for line in (out / run_name(task, kind, span) / "metrics.jsonl").open()
    ]
    metric = TASKS[task]["metric"]
    evaluated = [r for r in records if metric in r]
    trained = [r for r in records if "tokens_per_s" in r]
    return {
        "run": run_name(task, kind, span),
        "task": task,
        "kind": kind,
        "max_span": span,
        "seed": seed,
        "steps": records[-1]["step"],
        metric: evaluated[-1][metric],
        "valid_memory_size": evaluated[-1]["valid_memory_size"],
        **{k: v for k, v in evaluated[-1].items() if k in BASELINES},
        "memory_size": sum(r["memory_size"] for r in trained) / len(trained),
        "tokens_per_s": sum(r["tokens_per_s"] for r in trained) / len(trained),
        "wall_s": round(wall, 1),
        "command": " ".join(command[1:]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python benchmarks/lm_compare.py", description=__doc__)
    parser.add_argument("--tasks", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--kinds", nargs="+", default=["expire_span", "transformer_xl"])
    parser.add_argument("--steps", type=int, default=1000, help="optimizer updates per run")
    parser.add_argument("--seed", type=int, default=0, help="train_lm.py's seed")
    parser.add_argument("--jobs", type=int, default=1, help="runs trained side by side")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "lm-compare")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    corpus = write_corpus(out / TEXT_CORPUS) if "text" in args.tasks else out / TEXT_CORPUS
    runs = planned_runs(args.tasks, args.kinds)
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(train, task, kind, span, args.steps, args.seed, out, corpus)
            for task, kind, span in runs
        ]
        for future in futures:
            print(json.dumps(future.result()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
