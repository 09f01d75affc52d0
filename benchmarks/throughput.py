"""Training throughput of train_rl.py and train_lm.py end to end, optionally against a commit.

    python benchmarks/throughput.py [--reference REV] [--steps 96000] [--kinds expire_span]

Each setting runs a trainer with its defaults (every core) in a fresh process:
- ``corridor_3_20``: the RL default command on Corridor 3..20, `env.max_length=20` (PPO, 32
  environments, the paper's 2-layer, 64-unit agent);
- ``corridor_start``: the full Corridor from the start, spans near their initial L/2;
- ``corridor_steady``: the full Corridor with spans as short as a trained agent keeps
  (`memory.init_span_fraction=0.1`, 20 steps);
- ``lm_copy``: train_lm.py on the copy task (the lm.yaml model: 4 layers, 128 units, blocks
  of 128 tokens, 16 streams), 120 updates.
With ``--reference REV`` the same settings also run from that commit's code (exported with
`git archive`), one after the other in this run, so both see the same machine and load.

Prints one JSON object per run, {"setting", "memory", "code", "per_s", "unit", "memory_size"},
with per_s the mean of the logged rate (environment steps or tokens per second) after the
first logging interval (start-up excluded); then, with a reference, one {"setting", "memory",
"ratio"} per pair: the working tree's rate over the reference's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
WORKING_TREE = "working tree"


class Setting(NamedTuple):
    script: str
    overrides: list[str]
    unit: str  # what the rate counts
    rate_key: str  # the metric the trainer logs it as
    total_steps: int | None = None  # fixed length of the run; None: --steps


RL_COMMON = ["log_interval=5", "eval.after_training=false"]
SETTINGS = {
    "corridor_3_20": Setting("train_rl.py", ["env.max_length=20", *RL_COMMON], "steps", "sps"),
    "corridor_start": Setting("train_rl.py", RL_COMMON, "steps", "sps"),
    "corridor_steady": Setting(
        "train_rl.py", ["memory.init_span_fraction=0.1", *RL_COMMON], "steps", "sps"
    ),
    "lm_copy": Setting(
        "train_lm.py",
        ["task=copy", "log_interval=20", "eval_interval=1000"],
        "tokens",
        "tokens_per_s",
        total_steps=120,
    ),
}


def run_trainer(code_dir: Path, script: str, overrides: list[str]) -> list[dict]:
    """Runs ``code_dir``/``script`` with ``overrides`` in a fresh process and a temporary
    run directory; returns its metrics lines."""
    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run(
            [
                sys.executable,
                str(code_dir / script),
                *overrides,
                "checkpoint_interval=1000",
                "wandb.mode=disabled",
                f"hydra.run.dir={run_dir}",
            ],
            check=True,
            capture_output=True,
            cwd=run_dir,
        )
        return [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]


def measure(code_dir: Path, setting: Setting, kind: str, steps: int) -> dict:
    """One run of ``setting`` with the code in ``code_dir``: its mean rate after the first
    logging interval."""
    overrides = [f"memory={kind}", f"total_steps={setting.total_steps or steps}"]
    lines = run_trainer(code_dir, setting.script, overrides + setting.overrides)
    lines = [line for line in lines if setting.rate_key in line]
    timed = lines[1:] or lines
    return {
        "per_s": round(sum(line[setting.rate_key] for line in timed) / len(timed)),
        "unit": setting.unit,
        "memory_size": round(sum(line["memory_size"] for line in timed) / len(timed), 1),
    }


def export_commit(revision: str, into: Path) -> str:
    """Writes the files of commit ``revision`` into ``into``; returns its short hash."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{revision}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def code_versions(reference: str | None, into: Path) -> dict[str, Path]:
    """The code to measure, by name: ``reference`` exported into ``into`` (measured first),
    if given, then the working tree."""
    codes = {export_commit(reference, into): into} if reference else {}
    return {**codes, WORKING_TREE: ROOT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96000, help="steps per RL run")
    parser.add_argument("--kinds", nargs="+", default=["expire_span"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--reference", help="a commit to measure the same way, e.g. HEAD~3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as reference_dir:
        codes = code_versions(args.reference, Path(reference_dir))
        for setting in args.settings:
            for kind in args.kinds:
                rates = {}
                for code, code_dir in codes.items():
                    result = measure(code_dir, SETTINGS[setting], kind, args.steps)
                    rates[code] = result["per_s"]
                    row = {"setting": setting, "memory": kind, "code": code, **result}
                    print(json.dumps(row), flush=True)
                if args.reference:
                    reference = next(iter(rates))
                    ratio = round(rates[WORKING_TREE] / rates[reference], 2)
                    print(json.dumps({"setting": setting, "memory": kind, "ratio": ratio}))


if __name__ == "__main__":
    main()
