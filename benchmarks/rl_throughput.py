"""Training steps per second of train_rl.py end to end, optionally against a reference commit.

    python benchmarks/rl_throughput.py [--reference REV] [--steps 96000] [--kinds expire_span]

Each setting runs `train_rl.py` with its defaults (PPO, 32 environments, the paper's 2-layer,
64-unit agent, every core) in a fresh process:
- ``corridor_3_20``: the default command on Corridor 3..20, `env.max_length=20`;
- ``corridor_start``: the full Corridor from the start, spans near their initial L/2;
- ``corridor_steady``: the full Corridor with spans as short as a trained agent keeps
  (`memory.init_span_fraction=0.1`, 20 steps).
With ``--reference REV`` the same settings also run from that commit's code (exported with
`git archive`), one after the other in this run, so both see the same machine and load.

Prints one JSON object per run, {"setting", "memory", "code", "steps_per_s", "memory_size"},
with steps_per_s the mean of the logged `sps` after the first logging interval (start-up
excluded); then, with a reference, one {"setting", "memory", "ratio"} per pair: the working
tree's steps/s over the reference's.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {
    "corridor_3_20": ["env.max_length=20"],
    "corridor_start": [],
    "corridor_steady": ["memory.init_span_fraction=0.1"],
}
WORKING_TREE = "working tree"


def measure(code_dir: Path, overrides: list[str], kind: str, steps: int) -> dict:
    """One run of ``code_dir``/train_rl.py; its mean steps/s after the first interval."""
    with tempfile.TemporaryDirectory() as run_dir:
        subprocess.run(
            [
                sys.executable,
                str(code_dir / "train_rl.py"),
                *overrides,
                f"memory={kind}",
                f"total_steps={steps}",
                "log_interval=5",
                "eval.after_training=false",
                "wandb.mode=disabled",
                f"hydra.run.dir={run_dir}",
            ],
            check=True,
            capture_output=True,
            cwd=code_dir,
        )
        lines = [json.loads(line) for line in Path(run_dir, "metrics.jsonl").open()]
    timed = lines[1:] or lines
    return {
        "steps_per_s": round(sum(line["sps"] for line in timed) / len(timed)),
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96000, help="steps per run")
    parser.add_argument("--kinds", nargs="+", default=["expire_span"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=SETTINGS)
    parser.add_argument("--reference", help="a commit to measure the same way, e.g. HEAD~3")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as reference_dir:
        codes = {WORKING_TREE: ROOT}
        if args.reference:
            codes = {export_commit(args.reference, Path(reference_dir)): Path(reference_dir)}
            codes[WORKING_TREE] = ROOT
        for setting in args.settings:
            for kind in args.kinds:
                rates = {}
                for code, code_dir in codes.items():
                    result = measure(code_dir, SETTINGS[setting], kind, args.steps)
                    rates[code] = result["steps_per_s"]
                    row = {"setting": setting, "memory": kind, "code": code, **result}
                    print(json.dumps(row), flush=True)
                if args.reference:
                    reference = next(iter(rates))
                    ratio = round(rates[WORKING_TREE] / rates[reference], 2)
                    print(json.dumps({"setting": setting, "memory": kind, "ratio": ratio}))


if __name__ == "__main__":
    main()
