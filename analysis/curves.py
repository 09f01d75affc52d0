"""Learning curves of runs, and whether each run holds what it learns.

    python -m analysis.curves RUN_DIR [RUN_DIR ...] --out FIGURE.png [--markdown] [--label KEY ...]

Draws the task metric, the average memory size and (Expire-Span runs) every layer's mean and
largest span against environment steps, one line per run (every seed shown), one colour per memory
setting. Prints one row per run: where it first reached the target, and over the rest of the
run its lowest interval, its mean, and its mean memory size. A run *holds* when it reaches
the target, never falls below the floor afterwards, and keeps a mean at or above the target
over that part (with --max-memory, at a mean memory size no larger): a peak that does not
last is reported as such.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from omegaconf import OmegaConf

from analysis.plot import KIND_STYLES, PlotError, _series, find_run_dirs
from analysis.runs import RL, require_run_kind, saved_config
from envs.registry import task_metric
from training import CONFIG_FILE, METRICS_FILE, atomic_open, read_metrics


@dataclass
class Holding:
    """How a run's task metric behaves once it first reaches the target."""

    reached_at: int | None  # step of the first interval at or above the target
    lowest_after: float | None  # lowest interval from then on (the first included)
    mean_after: float | None
    memory_after: float | None  # mean memory size over the same intervals
    holds: bool


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
    first = next((i for i, r in enumerate(rows) if r[metric] >= target), None)
    if first is None:
        return Holding(None, None, None, None, False)
    after = rows[first:]
    values = [r[metric] for r in after]
    memory = [r["memory_size"] for r in after]
    lowest, mean, memory_mean = min(values), sum(values) / len(values), sum(memory) / len(memory)
    small = max_memory is None or memory_mean <= max_memory
    return Holding(
        rows[first]["step"], lowest, mean, memory_mean, lowest >= floor and mean >= target and small
    )


def run_label(cfg: Any, keys: Sequence[str] = ()) -> str:
    """The setting of a run: its memory kind, its span for fixed-span memories, and the
    values of the config ``keys`` (e.g. memory.attended_span_coef)."""
    kind = cfg.memory.kind
    parts = [KIND_STYLES.get(kind, (kind,))[0]]
    if kind in ("transformer_xl", "compressive", "adaptive_span"):
        parts[0] += f" L={cfg.memory.max_span}"
    parts += [f"{key.split('.')[-1]}={OmegaConf.select(cfg, key)}" for key in keys]
    return ", ".join(parts)


def plot_curves(runs: Sequence[tuple[str, str, list[dict[str, Any]]]]) -> Figure:
    """Panels of the task metric, memory size and, when logged, every layer's mean and largest
    span against steps; runs: (label, metric, records)."""
    with_spans = any("span/l0_mean" in r for _, _, records in runs for r in records)
    panels = 4 if with_spans else 2
    figure = Figure(figsize=(4.5 * panels, 4), layout="constrained")
    axes = figure.subplots(1, panels)
    labels = sorted({label for label, _, _ in runs})
    colours = {label: f"C{i}" for i, label in enumerate(labels)}
    for label, metric, records in runs:
        colour = colours[label]
        steps = [r["step"] for r in records if r.get(metric) is not None]
        axes[0].plot(steps, _series(records, metric), color=colour, lw=1, alpha=0.8)
        axes[1].plot(
            [r["step"] for r in records], [r["memory_size"] for r in records], color=colour, lw=1
        )
        layer = 0
        while with_spans and f"span/l{layer}_mean" in records[-1]:
            style = ("-", "--", ":", "-.")[layer % 4]
            for ax, stat in ((axes[2], "mean"), (axes[3], "max")):
                key = f"span/l{layer}_{stat}"
                logged = [r for r in records if key in r]
                ax.plot(
                    [r["step"] for r in logged],
                    [r[key] for r in logged],
                    color=colour,
                    ls=style,
                    lw=1,
                )
            layer += 1
    for label in labels:
        axes[0].plot([], [], color=colours[label], label=label)
    axes[0].legend(fontsize=8)
    axes[0].set_ylabel(" / ".join(sorted({metric for _, metric, _ in runs})))
    axes[1].set_ylabel("average memory size")
    if with_spans:
        axes[2].set_ylabel("mean span of new memories (layer 0 -, 1 --)")
        axes[3].set_ylabel("largest span of new memories (layer 0 -, 1 --)")
    for ax in axes:
        ax.set_xlabel("environment steps")
        ax.grid(alpha=0.3)
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
    runs, rows = [], []
    for run_dir, cfg in configs.items():
        if cfg is None or not (run_dir / METRICS_FILE).is_file():
            missing = CONFIG_FILE if cfg is None else METRICS_FILE
            print(f"{parser.prog}: skipping {run_dir}: no {missing}", file=sys.stderr)
            continue
        records = read_metrics(run_dir / METRICS_FILE)
        metric = task_metric(cfg.env.name, records)
        label = run_label(cfg, args.label)
        runs.append((label, metric, records))
        result = holding(records, metric, args.target, args.floor, args.max_memory)
        rows.append((label, cfg.seed, records[-1]["step"], result))
    if not runs:
        print(f"{parser.prog}: error: no run with metrics under {args.run_dirs}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(args.out, "wb") as file:
            plot_curves(runs).savefig(file, format="png", dpi=110)

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
    )
    lines = [header] + [
        (
            label,
            str(seed),
            f"{steps / 1e6:.2f}M",
            "never" if r.reached_at is None else f"{r.reached_at / 1e3:.0f}k",
            number(r.lowest_after, 2),
            number(r.mean_after, 3),
            number(r.memory_after, 1),
            "yes" if r.holds else "no",
        )
        for label, seed, steps, r in rows
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for line in lines[1:]:
            print("| " + " | ".join(line) + " |")
    else:
        for line in lines:
            print("  ".join(f"{cell:>14}" for cell in line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
