"""The learner setting each memory of the suite runs at, chosen on its tuning runs.

    python -m analysis.tuning docs/results/tuning [--write configs/tuned]

Reads the runs of the tuning grid (`scripts/tuning.sh`: PPO epochs x rate schedule for each
memory, on the tuning tasks and seeds) and scores each as the aggregates do
(`analysis.aggregate`: its final score, the mean of its task metric over the last tenth of its
steps, normalised to [0, 1]). Prints, per memory and setting, the mean final score per task and
over all its runs; a memory's choice is the setting with the highest mean (the first in grid
order on a tie). Every memory must have the same tasks and seeds under every setting: the same
tuning budget. `--write DIR` writes each memory's choice to DIR/<memory>.yaml, which the
default preset's POPGym and MiniGrid runs of that memory take (configs/preset_env/).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

from analysis.aggregate import score_run
from analysis.results import PlotError, RunResult
from analysis.settings import collect
from training.files import atomic_open

TUNED = ("agent.epochs", "agent.lr_schedule")  # the settings the grid varies
COMMAND = "python -m analysis.tuning"

Setting = tuple  # the values of TUNED, in order


class TuningError(Exception):
    """Tuning runs that cannot choose: a memory given a different budget than another."""


def final_scores(runs: Sequence[RunResult]) -> dict[str, dict[Setting, dict[str, list]]]:
    """Per memory, per setting, per task: the (seed, final score) of each run."""
    table: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for run in runs:
        setting = tuple(run.config[key] for key in TUNED)
        score = score_run(run.run_dir, run.group, run.kind, run.seed, run.metric)
        table[run.kind][setting][run.group].append((run.seed, score.final))
    return table


def check_same_budget(table: dict[str, dict[Setting, dict[str, list]]]) -> None:
    """Every memory and setting has runs on the same tasks and seeds."""
    budgets = {
        (kind, setting): sorted((task, seed) for task, runs in tasks.items() for seed, _ in runs)
        for kind, settings in table.items()
        for setting, tasks in settings.items()
    }
    grid = {setting for settings in table.values() for setting in settings}
    missing = [f"{kind} {s}" for kind in table for s in sorted(grid) if s not in table[kind]]
    expected = max(budgets.values(), key=len)
    uneven = [f"{kind} {s}" for (kind, s), budget in budgets.items() if budget != expected]
    if missing or uneven:
        raise TuningError(
            f"not every memory has the same tuning runs ({len(expected)} per setting, tasks x "
            f"seeds): missing or short: {', '.join(missing + uneven)}; finish the grid first"
        )


def choices(table: dict[str, dict[Setting, dict[str, list]]]) -> dict[str, tuple]:
    """Per memory: (its chosen setting, that setting's mean final score, its number of runs)."""
    chosen = {}
    for kind, settings in table.items():
        means = {s: _mean(tasks) for s, tasks in sorted(settings.items(), key=_grid_order)}
        best = max(means, key=means.get)  # (the first in grid order on a tie)
        chosen[kind] = (best, means[best], sum(len(runs) for runs in settings[best].values()))
    return chosen


def markdown(table: dict[str, dict[Setting, dict[str, list]]]) -> str:
    """A row per memory and setting: mean final score per task, over all runs, runs, chosen."""
    tasks = sorted({task for settings in table.values() for s in settings.values() for task in s})
    chosen = choices(table)
    header = ["memory", *(key.split(".")[-1] for key in TUNED), *tasks, "mean", "runs", "chosen"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind in sorted(table):
        for setting, by_task in sorted(table[kind].items(), key=_grid_order):
            cells = [_task_mean(by_task.get(task, [])) for task in tasks]
            runs = sum(len(r) for r in by_task.values())
            mark = "yes" if chosen[kind][0] == setting else ""
            row = [kind, *map(str, setting), *cells, f"{_mean(by_task):.3f}", str(runs), mark]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_choices(table: dict[str, dict[Setting, dict[str, list]]], runs_dir: str, out: Path):
    """DIR/<memory>.yaml per memory: its chosen setting, and which runs chose it."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, (setting, mean, count) in choices(table).items():
        seeds = sorted(
            {seed for tasks in table[kind].values() for r in tasks.values() for seed, _ in r}
        )
        lines = [
            "# @package _global_",
            f"# memory={kind} on POPGym and MiniGrid (preset=default): its tuning's choice,",
            f"# mean final score {mean:.3f} over {count} runs (seeds {', '.join(map(str, seeds))}) "
            f"in {runs_dir}:",
            f"# {COMMAND} {runs_dir} --write {out}",
        ]
        settings = OmegaConf.from_dotlist(
            [f"{key}={value}" for key, value in zip(TUNED, setting, strict=True)]
        )
        path = out / f"{kind}.yaml"
        with atomic_open(path, "w") as file:
            file.write("\n".join(lines) + "\n" + OmegaConf.to_yaml(settings))
        written.append(path)
    return written


def _task_mean(runs: list) -> str:
    """The mean final score of a setting's runs on one task; "-" before any has finished."""
    return f"{np.mean([final for _, final in runs]):.3f}" if runs else "-"


def _mean(by_task: dict[str, list]) -> float:
    return float(np.mean([final for runs in by_task.values() for _, final in runs]))


def _grid_order(item: tuple[Setting, object]) -> tuple:
    return tuple(str(value) for value in item[0])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n")[0])
    parser.add_argument("runs_dir", help="the tuning runs (each RUN_DIR with config and metrics)")
    parser.add_argument(
        "--write", type=Path, help="write each memory's choice to DIR/<memory>.yaml"
    )
    args = parser.parse_args(argv)
    try:
        table = final_scores(collect([args.runs_dir]))
        print(markdown(table))
        if args.write:
            check_same_budget(table)
            for path in write_choices(table, args.runs_dir, args.write):
                print(path, file=sys.stderr)
    except (PlotError, TuningError) as error:
        print(f"{COMMAND}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
