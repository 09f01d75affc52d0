"""Learning curves of runs, and whether each run holds what it learns.

    python -m analysis.curves RUN_DIR [RUN_DIR ...] --out FIGURE.png [--markdown] [--label KEY ...]
        [--acting]

Draws the task metric, the average memory size and (Expire-Span runs) every layer's mean and
largest span against environment steps, one line per run (every seed shown), one colour per memory
setting. Prints one row per run: where it first reached the target, and over the rest of the
run its lowest interval, its mean, and its mean memory size (a run that never reaches it: its
best interval), then its final evaluation (RUN_DIR/eval.json) if it has one. A run *holds*
when it reaches the target, never falls below the floor afterwards, and keeps a mean at or
above the target over that part (with --max-memory, at a mean memory size no larger): a peak
that does not last is reported as such. With --acting, the evaluation's columns are how each
policy acts (eval.json of both policies): success, the share of episodes cut by the step limit,
the mean episode length over the shortest path's, and the share of the greedy policy's steps
whose most likely move is blocked. Then the median step of the first target interval over the
runs that reached it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import cycle
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from omegaconf import OmegaConf

from analysis.results import PlotError, find_run_dirs, logged_values
from analysis.runs import RL, require_run_kind, saved_config
from analysis.settings import KIND_STYLES
from envs.registry import task_metric
from training.files import atomic_open
from training.metrics import METRICS_FILE, read_metrics
from training.run_dir import CONFIG_FILE, EVAL_FILE


@dataclass
class Holding:
    """How a run's task metric behaves once it first reaches the target."""

    reached_at: int | None  # step of the first interval at or above the target
    lowest_after: float | None  # lowest interval from then on (the first included)
    mean_after: float | None
    memory_after: float | None  # mean memory size over the same intervals
    holds: bool
    best: float | None  # the best interval of the run (None: no interval has a value)


def holding(
    records: Sequence[dict[str, Any]],
    metric: str,
    target: float,
    floor: float,
    max_memory: float | None = None,
) -> Holding:
    """The stability criterion over a run's logged intervals (intervals without a value, as
    when no episode ended, are skipped); ``max_memory``: also at most this mean memory size."""
    rows = [r for r in records if r.get(metric) is not None and not math.isnan(r[metric])]
    best = max((r[metric] for r in rows), default=None)
    first = next((i for i, r in enumerate(rows) if r[metric] >= target), None)
    if first is None:
        return Holding(None, None, None, None, False, best)
    after = rows[first:]
    values = [r[metric] for r in after]
    memory = [r["memory_size"] for r in after]
    lowest, mean, memory_mean = min(values), sum(values) / len(values), sum(memory) / len(memory)
    small = max_memory is None or memory_mean <= max_memory
    holds = lowest >= floor and mean >= target and small
    return Holding(rows[first]["step"], lowest, mean, memory_mean, holds, best)


def first_reached(result: Holding) -> str:
    """Where a run first reached the target, or that it never did and its best interval."""
    if result.reached_at is None:
        return "never" if result.best is None else f"never (best {result.best:.2f})"
    return f"{result.reached_at / 1e3:.0f}k"


def evaluation_cells(run_dir: Path, metric: str, cfg: Any) -> tuple[str, str]:
    """The run's final evaluation (RUN_DIR/eval.json), if it has one: its task metric by each
    policy it acted by, and the memory size of the first. (Runs before the evaluation by both
    policies wrote one outcome, the policy named by their config's eval.greedy.)"""
    path = run_dir / EVAL_FILE
    if not path.is_file():
        return "-", "-"
    result = json.loads(path.read_text())
    if metric in result:  # one policy's outcome
        policy = "greedy" if OmegaConf.select(cfg, "eval.greedy", default=True) else "sampled"
        result = {policy: result}
    scores = ", ".join(f"{outcome[metric]:.2f} {policy}" for policy, outcome in result.items())
    return scores, f"{next(iter(result.values()))['memory_size']:.1f}"


ACTING_HEADER = (
    "success (greedy / sampled)",
    "cut by the step limit",
    "length / shortest",
    "blocked (greedy)",
    "memory in evaluation",
)


def acting_cells(run_dir: Path) -> tuple[str, ...]:
    """How the final checkpoint's greedy and sampled policies act (RUN_DIR/eval.json of both
    policies; "-" where the run has none, or a field its evaluation did not write)."""
    path = run_dir / EVAL_FILE
    result = json.loads(path.read_text()) if path.is_file() else {}
    if not {"greedy", "sampled"} <= result.keys():
        return ("-",) * len(ACTING_HEADER)
    greedy, sampled = result["greedy"], result["sampled"]

    def cell(key: str, *outcomes: dict, digits: int = 3) -> str:
        return " / ".join("-" if key not in o else f"{o[key]:.{digits}f}" for o in outcomes)

    return (
        cell("success", greedy, sampled),
        cell("truncated", greedy, sampled),
        cell("length_ratio", greedy, sampled),
        cell("blocked_likely", greedy),
        cell("memory_size", greedy, digits=1),
    )


def median_first_reached(results: Sequence[Holding]) -> str:
    """The median step of the first target interval over the runs that reached it."""
    steps = sorted(r.reached_at for r in results if r.reached_at is not None)
    if not steps:
        return "none reached the target"
    middle = len(steps) // 2
    median = steps[middle] if len(steps) % 2 else (steps[middle - 1] + steps[middle]) / 2
    return f"{median / 1e3:.0f}k over {len(steps)} of {len(results)} runs"


def run_label(cfg: Any, keys: Sequence[str] = ()) -> str:
    """The setting of a run: its memory kind, its span for fixed-span memories, and the
    values of the config ``keys`` (e.g. memory.attended_span_coef)."""
    kind = cfg.memory.kind
    parts = [KIND_STYLES.get(kind, (kind,))[0]]
    if kind in ("transformer_xl", "compressive", "adaptive_span"):
        parts[0] += f" L={cfg.memory.max_span}"
    parts += [f"{key.split('.')[-1]}={OmegaConf.select(cfg, key)}" for key in keys]
    return ", ".join(parts)


Run = tuple[str, list[dict[str, Any]]]  # (its label, the records of its metrics.jsonl)
Series = tuple[str, str]  # (a metric's key in the records, its label in the legend)
Panel = tuple[str, Sequence[Series]]  # (the y axis's label, its series)
STYLES = ("-", "--", ":", "-.")  # a panel's series, in order


def rl_panels(runs: Sequence[Run], metrics: Sequence[str]) -> list[Panel]:
    """An RL run's panels: the task metric(s), the average memory size and, where logged,
    every layer's mean and largest span of new memories."""
    layers = max(span_layers(records) for _, records in runs)
    panels = [(" / ".join(metrics), [(m, m) for m in metrics])]
    panels.append(("average memory size", [("memory_size", "memory size")]))
    for stat, what in (("mean", "mean"), ("max", "largest")):
        series = [(f"span/l{i}_{stat}", f"layer {i}") for i in range(layers)]
        if series:
            panels.append((f"{what} span of new memories", series))
    return panels


def span_layers(records: Sequence[dict[str, Any]]) -> int:
    """How many layers' spans a run logs (0: not an Expire-Span run)."""
    layers = 0
    while records and f"span/l{layers}_mean" in records[-1]:
        layers += 1
    return layers


def lm_panels(metric: str) -> list[Panel]:
    """A language-model run's panels: its losses, its task metric and its memory size, each
    split a line (a run logs training and validation at different updates)."""
    return [
        ("loss (nats per scored token)", [("train_loss", "train"), ("valid_loss", "valid")]),
        (metric, [(metric, "valid")]),
        ("average memory size", [("memory_size", "train"), ("valid_memory_size", "valid")]),
    ]


def plot_curves(
    runs: Sequence[Run], panels: Sequence[Panel], x_label: str = "environment steps"
) -> Figure:
    """One panel per (y label, series), one colour per run label and one line style per series,
    each series drawn at the records that logged it."""
    figure = Figure(figsize=(4.5 * len(panels), 4), layout="constrained")
    labels = sorted({label for label, _ in runs})
    colours = {label: f"C{i}" for i, label in enumerate(labels)}
    for axes, (y_label, series) in zip(figure.subplots(1, len(panels)), panels, strict=True):
        for label, records in runs:
            for (key, _), style in zip(series, cycle(STYLES)):
                steps = [r["step"] for r in records if isinstance(r.get(key), int | float)]
                marker = "." if len(steps) < 30 else None
                axes.plot(
                    steps,
                    logged_values(records, key),
                    color=colours[label],
                    ls=style,
                    lw=1,
                    marker=marker,
                )
        if len(series) > 1:
            for (_, name), style in zip(series, cycle(STYLES)):
                axes.plot([], [], color="grey", ls=style, label=name)
        axes.set_ylabel(y_label)
        axes.set_xlabel(x_label)
        axes.grid(alpha=0.3)
    first = figure.axes[0]
    for label in labels:
        first.plot([], [], color=colours[label], label=label)
    first.legend(fontsize=8)
    for axes in figure.axes[1:]:
        if axes.get_legend_handles_labels()[0]:
            axes.legend(fontsize=8)
    return figure


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.curves", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dirs", nargs="+", help="run directories, or sweeps holding them")
    parser.add_argument("--out", type=Path, help="PNG file for the figure")
    parser.add_argument("--target", type=float, default=0.95, help="level to reach and keep")
    parser.add_argument("--floor", type=float, default=0.9, help="lowest interval allowed after")
    parser.add_argument(
        "--max-memory", type=float, help="largest mean memory size allowed after (default: any)"
    )
    parser.add_argument(
        "--markdown", action="store_true", help="print the rows as a markdown table"
    )
    parser.add_argument("--label", nargs="*", default=[], help="config keys that tell runs apart")
    parser.add_argument(
        "--acting", action="store_true", help="how the greedy and sampled policies act"
    )
    args = parser.parse_args(argv)
    try:
        run_dirs = find_run_dirs(args.run_dirs)
    except PlotError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    configs = {run_dir: saved_config(run_dir) for run_dir in run_dirs}
    for run_dir, cfg in configs.items():
        if cfg is not None:
            require_run_kind(parser.prog, run_dir, cfg, RL)
    runs, metrics, rows = [], [], []
    for run_dir, cfg in configs.items():
        if cfg is None or not (run_dir / METRICS_FILE).is_file():
            missing = CONFIG_FILE if cfg is None else METRICS_FILE
            print(f"{parser.prog}: skipping {run_dir}: no {missing}", file=sys.stderr)
            continue
        records = read_metrics(run_dir / METRICS_FILE)
        metric = task_metric(cfg.env.name, records)
        label = run_label(cfg, args.label)
        runs.append((label, records))
        metrics.append(metric)
        result = holding(records, metric, args.target, args.floor, args.max_memory)
        evaluation = (
            acting_cells(run_dir) if args.acting else evaluation_cells(run_dir, metric, cfg)
        )
        rows.append((label, cfg.seed, records[-1]["step"], result, evaluation))
    if not runs:
        print(f"{parser.prog}: error: no run with metrics under {args.run_dirs}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(args.out, "wb") as file:
            figure = plot_curves(runs, rl_panels(runs, sorted(set(metrics))))
            figure.savefig(file, format="png", dpi=110)

    def number(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    header = (
        "memory",
        "seed",
        "steps",
        f"first >= {args.target}",
        "lowest after",
        "mean after",
        "memory after",
        "holds",
        *(ACTING_HEADER if args.acting else ("evaluation", "memory in evaluation")),
    )
    lines = [header] + [
        (
            label,
            str(seed),
            f"{steps / 1e6:.2f}M",
            first_reached(r),
            number(r.lowest_after, 3),
            number(r.mean_after, 3),
            number(r.memory_after, 1),
            "yes" if r.holds else "no",
            *evaluation,
        )
        for label, seed, steps, r, evaluation in rows
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
    else:
        for line in lines:
            print("  ".join(f"{cell:>14}" for cell in line))
    if args.acting:
        first = median_first_reached([r for _, _, _, r, _ in rows])
        print(f"\nmedian first >= {args.target}: {first}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
