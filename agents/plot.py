"""Performance against average memory size, one point per run (the paper's figures 4 and 5).

    python -m agents.plot SWEEP_DIR [SWEEP_DIR ...] --out OUT_DIR

Each SWEEP_DIR is a Hydra `-m` sweep (SWEEP_DIR/<job number>/config.yaml, metrics.jsonl)
or a single run directory. Writes OUT_DIR/runs.csv (one row per run) and one PNG per
environment or task, e.g. OUT_DIR/corridor_success.png, with every memory kind drawn apart.

A run's score is its final metric: the mean of the last FINAL_POINTS logged values (RL
metrics are noisy from one interval to the next), and its memory size likewise. The metric
is `success` on Corridor, `rooms_reached` on Portal, `return` on other RL envs; validation
bits per byte on enwik8/text and validation accuracy (or error) on the other LM tasks.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml
from matplotlib.figure import Figure  # drawn with Agg, without pyplot's global state
from omegaconf import OmegaConf

from training import CONFIG_FILE, METRICS_FILE, read_metrics

FINAL_POINTS = 5
MEMORY_SIZE = "memory_size"
TEXT_TASKS = ("enwik8", "text")
KIND_STYLES = {  # label, colour, marker
    "expire_span": ("Expire-Span", "tab:red", "o"),
    "transformer_xl": ("Transformer-XL", "tab:blue", "s"),
    "adaptive_span": ("Adaptive-Span", "tab:green", "^"),
    "compressive": ("Compressive", "tab:purple", "D"),
    "lstm": ("LSTM", "tab:gray", "x"),
}
OTHER_STYLES = [  # colour, marker for any other kind
    ("tab:orange", "v"),
    ("tab:brown", "P"),
    ("tab:pink", "*"),
    ("tab:olive", "h"),
    ("tab:cyan", "<"),
]
METRIC_LABELS = {
    "success": "success rate",
    "rooms_reached": "rooms reached",
    "return": "episode return",
    "valid_bpb": "validation bits per byte (lower is better)",
    "valid_accuracy": "validation accuracy",
    "valid_error": "validation error (lower is better)",
}


class PlotError(Exception):
    """Input the tool cannot use; the message says what was wrong."""


class NotReadyError(PlotError):
    """A run with nothing to plot yet (no config or metrics written); skipped with a warning."""


@dataclass
class RunResult:
    """One run's row in runs.csv and point in the figure."""

    run_dir: str
    group: str  # the environment or LM task: one figure per group
    kind: str
    max_span: int | None
    seed: int
    metric: str
    final: float
    memory_size: float | None
    steps: int


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run directories under the given sweep or run directories, in job-number order.

    A run directory holds config.yaml, or is a Hydra job directory (it has .hydra/) whose
    run stopped before writing one; the search does not look inside run directories.
    """
    found = []
    for path in map(Path, paths):
        if not path.exists():
            raise PlotError(f"{path} does not exist")
        if not path.is_dir():
            raise PlotError(f"{path} is not a directory; give a sweep or run directory")
        runs = []
        for directory, subdirs, files in os.walk(path):
            if CONFIG_FILE in files or ".hydra" in subdirs:
                runs.append(Path(directory))
                subdirs.clear()
            else:
                subdirs[:] = [d for d in subdirs if not d.startswith(".") and d != "wandb"]
        if not runs:
            raise PlotError(
                f"no runs under {path}: expected {path}/<job>/{CONFIG_FILE} (a Hydra -m sweep) "
                f"or {path}/{CONFIG_FILE} (a run directory)"
            )
        found.extend(sorted(runs, key=_natural_key))
    return found


def read_run(run_dir: Path, metric: str | None = None, last: int = FINAL_POINTS) -> RunResult:
    """A run's final metric and memory size; NotReadyError if it has no usable metrics yet."""
    if not (run_dir / CONFIG_FILE).is_file():
        raise NotReadyError(f"{run_dir}: no {CONFIG_FILE} (the run stopped before it started?)")
    try:
        cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    except yaml.YAMLError as error:
        raise PlotError(f"{run_dir / CONFIG_FILE} is not valid YAML: {error}") from error
    is_lm = "task" in cfg
    group = str(_config_value(cfg, "task.name" if is_lm else "env.name", run_dir))
    kind = str(_config_value(cfg, "memory.kind", run_dir))
    candidates = (metric,) if metric else _metric_candidates(group, is_lm)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise NotReadyError(f"{run_dir}: no {METRICS_FILE} yet")
    try:
        records = read_metrics(metrics_path)
    except ValueError as error:
        raise PlotError(str(error)) from error
    if not records:
        raise NotReadyError(f"{run_dir}: {METRICS_FILE} is empty")
    chosen = next((key for key in candidates if _series(records, key)), None)
    if chosen is None:
        raise NotReadyError(f"{run_dir}: no values of {' or '.join(candidates)} logged yet")
    memory_sizes = _series(records, MEMORY_SIZE)
    return RunResult(
        run_dir=str(run_dir),
        group=group,
        kind=kind,
        max_span=OmegaConf.select(cfg, "memory.max_span"),
        seed=_config_value(cfg, "seed", run_dir),
        metric=chosen,
        final=_mean_of_last(_series(records, chosen), last),
        memory_size=_mean_of_last(memory_sizes, last) if memory_sizes else None,
        steps=int(records[-1]["step"]),
    )


def plot_panel(results: Sequence[RunResult], logx: bool = False) -> Figure:
    """One group's figure: final metric against memory size, a colour and marker per kind."""
    figure = Figure(figsize=(5.5, 4), layout="constrained")
    axes = figure.subplots()
    known = [kind for kind in KIND_STYLES if any(r.kind == kind for r in results)]
    others = sorted({r.kind for r in results} - set(KIND_STYLES))
    styles = [KIND_STYLES[kind] for kind in known] + [
        (kind, *OTHER_STYLES[index % len(OTHER_STYLES)]) for index, kind in enumerate(others)
    ]
    for kind, (label, colour, marker) in zip(known + others, styles, strict=True):
        runs = [r for r in results if r.kind == kind and r.memory_size is not None]
        if not runs:
            continue
        axes.scatter(
            [r.memory_size for r in runs],
            [r.final for r in runs],
            label=label,
            color=colour,
            marker=marker,
            s=40,
        )
    metric = results[0].metric
    axes.set_xlabel("average memory size $|C_t|$")
    axes.set_ylabel(METRIC_LABELS.get(metric, metric))
    axes.set_title(f"{results[0].group}: {metric} against memory size")
    if logx:
        axes.set_xscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    return figure


def write_csv(results: Sequence[RunResult], path: Path) -> None:
    """runs.csv: one row per run, columns as RunResult's fields."""
    with open(path, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(RunResult.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(asdict(result) for result in results)


def plot_sweeps(
    sweep_dirs: Sequence[str | os.PathLike],
    out_dir: Path,
    metric: str | None = None,
    last: int = FINAL_POINTS,
    logx: bool = False,
) -> list[Path]:
    """Read every run, write runs.csv and one PNG per (group, metric); return the paths."""
    results, skipped = [], []
    for run_dir in find_run_dirs(sweep_dirs):
        try:
            results.append(read_run(run_dir, metric, last))
        except NotReadyError as reason:
            skipped.append(str(reason))
    if skipped:
        print(
            f"skipped {len(skipped)} run(s) with nothing to plot yet:\n  " + "\n  ".join(skipped),
            file=sys.stderr,
        )
    if not results:
        raise PlotError("no run has usable metrics yet")
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path = out_dir / "runs.csv"
    write_csv(results, csv_path)
    written = [csv_path]
    for group, group_metric in sorted({(r.group, r.metric) for r in results}):
        panel = [r for r in results if (r.group, r.metric) == (group, group_metric)]
        if all(r.memory_size is None for r in panel):
            print(f"{group}: no run logged {MEMORY_SIZE}; no figure", file=sys.stderr)
            continue
        path = out_dir / f"{_file_name(group)}_{group_metric}.png"
        plot_panel(panel, logx).savefig(path, dpi=150)
        written.append(path)
    return written


def _metric_candidates(group: str, is_lm: bool) -> tuple[str, ...]:
    name = group.lower()
    if is_lm:
        if name in TEXT_TASKS:
            return ("valid_bpb", "bpb")
        return ("valid_accuracy", "valid_error", "accuracy", "error")
    if "corridor" in name:
        return ("success",)
    if "portal" in name:
        return ("rooms_reached",)
    return ("return",)


def _config_value(cfg: Any, key: str, run_dir: Path) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    if value is None:
        raise PlotError(
            f"{run_dir / CONFIG_FILE} has no {key}; plot runs written by train_rl.py or train_lm.py"
        )
    return value


def _series(records: list[dict[str, Any]], key: str) -> list[float]:
    """The logged values of `key`, skipping intervals where it was absent or null."""
    return [r[key] for r in records if isinstance(r.get(key), (int, float))]


def _mean_of_last(values: list[float], count: int) -> float:
    tail = values[-count:]
    return math.fsum(tail) / len(tail)


def _natural_key(path: Path) -> list[Any]:
    """Sort job directories 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents.plot",
        description="Plot final performance against average memory size, one point per run.",
    )
    parser.add_argument("sweep_dirs", nargs="+", help="Hydra sweep directories or run directories")
    parser.add_argument("--out", required=True, type=Path, help="directory for runs.csv and PNGs")
    parser.add_argument("--metric", help="metrics.jsonl key to plot instead of the task's default")
    parser.add_argument(
        "--last",
        type=int,
        default=FINAL_POINTS,
        help=f"final value = mean of this many last logged points (default {FINAL_POINTS})",
    )
    parser.add_argument("--logx", action="store_true", help="log-scale memory-size axis")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error(f"--last={args.last} must be at least 1")
    try:
        written = plot_sweeps(args.sweep_dirs, args.out, args.metric, args.last, args.logx)
    except PlotError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
