"""Wall-clock seconds until train_rl.py first logs a success rate at a target, over seeds,
optionally against a reference commit.

    python benchmarks/time_to_success.py [--target 0.9] [--seeds 100 101 102] [--reference REV]
        [--steps 480000] [-- OVERRIDE ...]

Each seed runs `train_rl.py env.max_length=20` (Corridor 3..20, the default learner) unless
overrides follow `--` (e.g. `-- env.max_length=200` with `--target 0.95 --steps 3000000` for
the full Corridor), in a fresh process, one run at a time. The time of a logging interval is
its steps over its logged `sps`, so start-up (imports, building the environments) is not
counted, and evaluation after training is off.

Prints one JSON object per run, {"code", "seed", "steps", "seconds"} (null for both when the
target was not reached within --steps), then one {"code", "median_seconds", "reached"} per
code version.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from throughput import code_versions, run_trainers


def time_to_target(lines: list[dict], target: float) -> tuple[int | None, float | None]:
    """Steps and seconds of training until the first logging interval whose success reaches
    ``target``; (None, None) if none does."""
    seconds, previous_step = 0.0, 0
    for line in lines:
        seconds += (line["step"] - previous_step) / line["sps"]
        previous_step = line["step"]
        if line.get("success", 0.0) >= target:
            return line["step"], round(seconds, 1)
    return None, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.9, help="success rate to reach")
    parser.add_argument("--seeds", type=int, nargs="+", default=[100, 101, 102])
    parser.add_argument("--steps", type=int, default=480000, help="the most steps per run")
    parser.add_argument("--reference", help="a commit to measure the same way, e.g. HEAD~3")
    parser.add_argument("overrides", nargs="*", help="train_rl.py overrides, after --")
    args = parser.parse_args()
    overrides = args.overrides or ["env.max_length=20"]
    with tempfile.TemporaryDirectory() as reference_dir:
        codes = code_versions(args.reference, Path(reference_dir))
        for code, code_dir in codes.items():
            times = []
            for seed in args.seeds:
                run = [*overrides, f"seed={seed}", f"total_steps={args.steps}"]
                run.append("eval.after_training=false")
                (lines,) = run_trainers(code_dir, "train_rl.py", run, count=1)
                steps, seconds = time_to_target(lines, args.target)
                print(
                    json.dumps({"code": code, "seed": seed, "steps": steps, "seconds": seconds}),
                    flush=True,
                )
                if seconds is not None:
                    times.append(seconds)
            median = statistics.median(times) if times else None
            summary = {"code": code, "median_seconds": median, "reached": len(times)}
            print(json.dumps({**summary, "runs": len(args.seeds)}), flush=True)


if __name__ == "__main__":
    main()
