"""Performance against average memory size, one point per run (the paper's figures 4 and 5).

    python -m analysis.plot SWEEP_DIR [SWEEP_DIR ...] --out OUT_DIR [--markdown]

Each SWEEP_DIR is a Hydra `-m` sweep (SWEEP_DIR/<job number>/config.yaml, metrics.jsonl),
a single run directory, or a directory holding several of either. Writes to OUT_DIR:

- runs.csv: one row per run, its final metric, memory size, training time, last return and
  whether it held what it learned;
- settings.csv: one row per setting, i.e. runs that differ only in their seed, with the mean
  and standard deviation of their final metric, memory size, training time and last return,
  and how many of its runs held;
- one PNG per task, e.g. corridor_success.png: every run a faint point, every setting its
  mean with one-standard-deviation error bars; the settings of a memory kind that differ
  only in their span (e.g. Transformer-XL at several spans) are joined by a line;
- overview.png, all those panels side by side, when there are several.

`--markdown` prints the settings as markdown tables, one per figure, each followed, where the
figure has an Expire-Span setting and another, by the probability that a run of each
Expire-Span setting ends better than a run of every other setting, with its 95% bootstrap
interval (rliable; the "beats" or "matches" of a single task) and the p of a permutation test
of it (a difference is resolved where both show it), and where there are several
figures (a suite of tasks) one more, a row per task and a column per memory setting; for RL runs
over several tasks also the rliable aggregate (`analysis.aggregate`: normalised final scores and
POPGym's MMER per task, IQM and probability of improvement across seeds and learned tasks), and
draws it in aggregate.png (needs the `stats` extra). Runs of several budgets (total_steps) get
these two for each budget, the figure in aggregate_<steps>.png.

The task is the env config's name (corridor, portal, ...) or the LM task's, except for the
env configs that take any Gymnasium id (env=gym, env=popgym), where it is the id: a POPGym
sweep gives one figure per POPGym task.

A run's final metric, memory size, training time, last return and whether it held:
`analysis.results`; which runs make a setting: `analysis.settings`.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure  # drawn with Agg, without pyplot's global state

from analysis.aggregate import (
    BOOTSTRAP_REPS,
    MIN_COMPARED_RUNS,
    NO_MEMORY,
    NORMALISED,
    REFERENCE_KIND,
    AggregateError,
    RunScore,
    aggregate_markdown,
    comparison_markdown,
    plot_aggregate,
    score_run,
    setting_comparisons,
)
from analysis.results import FINAL_POINTS, PlotError, RunResult
from analysis.settings import (
    KIND_STYLES,
    Setting,
    by_figure,
    collect,
    label_settings,
    memory_order,
    setting_label,
    summarize,
    warn,
)
from training import atomic_open
from training.extras import installed

LOWER_BETTER = ("error", "bpb", "loss")  # metrics (by their ending) where less is better
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
    "mmer": "MMER (best interval mean return)",
    "valid_bpb": "validation bits per byte (lower is better)",
    "valid_accuracy": "validation accuracy",
    "valid_error": "validation error (lower is better)",
    "test_bpb": "test bits per byte (lower is better)",
    "test_accuracy": "test accuracy",
    "test_error": "test error (lower is better)",
}


RUN_COLUMNS = [f.name for f in fields(RunResult) if f.name != "config"]


SETTING_COLUMNS = [
    "group",
    "metric",
    "kind",
    "max_span",
    "setting",
    "runs",
    "seeds",
    "final_mean",
    "final_std",
    "memory_size_mean",
    "memory_size_std",
    "minutes_mean",
    "minutes_std",
    "steps",
    "last_return_mean",  # after the older columns, so that older settings.csv files still match
    "last_return_std",
    "held",
]


def plot_panel(settings: Sequence[Setting], logx: bool = False) -> Figure:
    """One figure: final metric against memory size, a colour and marker per memory kind."""
    figure = Figure(figsize=(5.5, 4), layout="constrained")
    draw_panel(figure.subplots(), settings, logx)
    return figure


def plot_overview(panels: Sequence[Sequence[Setting]], logx: bool = False) -> Figure:
    """The panels of several figures (e.g. one per POPGym task) in one image, 3 to a row."""
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(5.5 * columns, 4 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax, settings in zip(axes, panels, strict=False):
        draw_panel(ax, settings, logx)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    return figure


def draw_panel(axes: Axes, settings: Sequence[Setting], logx: bool = False) -> None:
    """Final metric against memory size on `axes`, a colour and marker per memory kind."""
    for kind, (label, colour, marker) in _kind_styles(s.kind for s in settings).items():
        ours = [s for s in settings if s.kind == kind and s.memory_size is not None]
        if not ours:
            continue
        runs = [run for s in ours for run in s.runs if run.memory_size is not None]
        axes.scatter(
            [run.memory_size for run in runs],
            [run.final for run in runs],
            color=colour,
            marker=marker,
            s=18,
            alpha=0.35,
            label=f"_{kind} runs",  # a leading underscore keeps it out of the legend
        )
        ours.sort(key=lambda s: s.memory_size[0])
        if len(ours) == 1 and ours[0].max_span is not None:
            label += f" ($L$={ours[0].max_span})"
        span_sweep = len(ours) > 1 and not any(s.setting for s in ours)
        axes.errorbar(
            [s.memory_size[0] for s in ours],
            [s.final[0] for s in ours],
            xerr=[s.memory_size[1] for s in ours],
            yerr=[s.final[1] for s in ours],
            color=colour,
            marker=marker,
            markersize=7,
            linestyle="-" if span_sweep else "none",  # a line only through a span sweep
            capsize=3,
            label=label,
        )
        if len(ours) > 1:
            show_span = len({s.max_span for s in ours}) > 1
            for s in ours:
                axes.annotate(
                    _note(s, show_span),
                    (s.memory_size[0], s.final[0]),
                    textcoords="offset points",
                    xytext=(6, 4),
                    fontsize=7,
                    color=colour,
                )
    metric, group = settings[0].metric, settings[0].group
    axes.set_xlabel("average memory size $|C_t|$")
    axes.set_ylabel(METRIC_LABELS.get(metric, metric))
    axes.set_title(group)  # the axis labels say what is plotted
    if logx:
        axes.set_xscale("log")
    axes.margins(0.1)  # room for the annotations at the edges
    axes.grid(alpha=0.3)
    axes.legend()


def markdown_table(settings: Sequence[Setting]) -> str:
    """The settings of one figure as a markdown table: mean ± standard deviation over seeds;
    the last return and held columns only for RL runs (LM runs have neither)."""
    metric = settings[0].metric
    with_setting = any(s.setting for s in settings)
    with_rl = any(s.held is not None or s.last_return is not None for s in settings)
    header = ["memory", "max span", *(["setting"] if with_setting else []), "runs"]
    header += ["memory size", metric, *(["last return", "held"] if with_rl else [])]
    header += ["steps", "minutes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in settings:
        label = KIND_STYLES.get(s.kind, (s.kind,))[0]
        row = [label, "" if s.max_span is None else str(s.max_span)]
        row += [s.setting] if with_setting else []
        size = "" if s.memory_size is None else _mean_std_text(*s.memory_size, len(s.runs))
        minutes = "" if s.minutes is None else _mean_std_text(*s.minutes, len(s.runs))
        row += [str(len(s.runs)), size, _mean_std_text(*s.final, len(s.runs))]
        if with_rl:
            last = "" if s.last_return is None else _mean_std_text(*s.last_return, len(s.runs))
            row += [last, _held_text(s.held)]
        row += [f"{s.steps:,}", minutes]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def task_table(settings: Sequence[Setting]) -> str:
    """A suite's summary as a markdown table: a row per figure (task), a column per memory
    setting with its final metric's mean ± standard deviation over seeds (to the decimal that
    shows the spread), then each setting's mean memory size and, for RL runs, how many of its
    runs held, in the columns' order."""
    in_order = sorted(settings, key=lambda s: (*memory_order(s), s.setting))
    columns = list(dict.fromkeys(setting_label(s) for s in in_order))
    with_held = any(s.held is not None for s in settings)
    header = ["task", *columns, "memory size: " + ", ".join(columns)]
    header += ["held: " + ", ".join(columns)] if with_held else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (group, metric), panel in by_figure(settings).items():
        cells = {setting_label(s): s for s in panel}
        found = [cells.get(column) for column in columns]
        row = [f"{group} ({metric})"]
        row += ["" if s is None else _spread_text(*s.final, len(s.runs)) for s in found]
        row.append(", ".join("-" if s is None else _size_text(s.memory_size) for s in found))
        if with_held:
            row.append(", ".join("-" if s is None else _held_text(s.held) for s in found))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def write_runs_csv(results: Sequence[RunResult], path: Path) -> None:
    """runs.csv: one row per run, columns as RunResult's fields (without the config)."""
    with atomic_open(path, "w") as file:
        writer = csv.DictWriter(file, fieldnames=RUN_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({name: getattr(run, name) for name in RUN_COLUMNS} for run in results)


def write_settings_csv(settings: Sequence[Setting], path: Path) -> None:
    """settings.csv: one row per setting, the mean and standard deviation over its runs."""
    with atomic_open(path, "w") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(SETTING_COLUMNS)
        for s in settings:
            writer.writerow(
                [s.group, s.metric, s.kind, s.max_span, s.setting, len(s.runs)]
                + [" ".join(map(str, s.seeds)), *s.final, *(s.memory_size or ("", ""))]
                + [*(s.minutes or ("", "")), s.steps, *(s.last_return or ("", ""))]
                + [_held_text(s.held)]
            )


def plot_sweeps(
    sweep_dirs: Sequence[str | os.PathLike],
    out_dir: Path,
    metric: str | None = None,
    last: int | None = None,
    logx: bool = False,
) -> tuple[list[Path], list[Setting]]:
    """Read every run, write runs.csv, settings.csv, one PNG per (group, metric) and, when
    there are several, overview.png with all of them.

    Returns the written paths and the settings (in figure order, as in settings.csv).
    """
    results = collect(sweep_dirs, metric, last)
    settings = summarize(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv", out_dir / "settings.csv"]
    write_runs_csv(results, written[0])
    write_settings_csv(settings, written[1])
    panels = []
    for (group, group_metric), panel in by_figure(settings).items():
        if all(s.memory_size is None for s in panel):
            print(f"{group}: no run logged a memory size; no figure", file=sys.stderr)
            continue
        panels.append(panel)
        written.append(out_dir / f"{_file_name(group)}_{group_metric}.png")
        _save_png(plot_panel(panel, logx), written[-1])
    if len(panels) > 1:
        written.append(out_dir / "overview.png")
        _save_png(plot_overview(panels, logx), written[-1])
    return written, settings


def _save_png(figure: Figure, path: Path) -> None:
    with atomic_open(path, "wb") as file:  # a sweep can be replotted while it runs
        figure.savefig(file, format="png", dpi=150)


def _note(setting: Setting, show_span: bool) -> str:
    """A setting's annotation in the figure: "$L$=10 ramp=2" for memory.max_span=10 and
    memory.ramp=2 (config keys shortened to their last part)."""
    other = re.sub(r"(?:\w+\.)+(\w+)=", r"\1=", setting.setting)
    return " ".join(
        part for part in (f"$L$={setting.max_span}" if show_span else "", other) if part
    )


def _mean_std_text(mean: float, std: float, count: int) -> str:
    return f"{mean:.3g}" if count == 1 else f"{mean:.3g} ± {std:.2g}"


def _spread_text(mean: float, std: float, count: int) -> str:
    """0.99987 ± 0.00001: three decimals, or as many as show the spread's first digit (up to
    six: a spread below that is rounding, shown as 0)."""
    decimals = 3 if std < 1e-6 else max(3, -math.floor(math.log10(std)))
    return f"{mean:.{decimals}f}" + ("" if count == 1 else f" ± {std:.{decimals}f}")


def _size_text(size: tuple[float, float] | None) -> str:
    return "" if size is None else f"{size[0]:.3g}"


def _held_text(held: tuple[int, int] | None) -> str:
    """(2, 3) -> "2/3": 2 of the 3 runs where it is known held; "" when unknown."""
    return "" if held is None else f"{held[0]}/{held[1]}"


def _kind_styles(kinds: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """Label, colour and marker of each kind present: known kinds first, in a fixed order."""
    present = set(kinds)
    styles = {kind: KIND_STYLES[kind] for kind in KIND_STYLES if kind in present}
    for index, kind in enumerate(sorted(present - set(KIND_STYLES))):
        styles[kind] = (kind, *OTHER_STYLES[index % len(OTHER_STYLES)])
    return styles


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.plot",
        description="Plot final performance against average memory size, one point per run.",
    )
    parser.add_argument("sweep_dirs", nargs="+", help="Hydra sweep directories or run directories")
    parser.add_argument("--out", required=True, type=Path, help="directory for the CSVs and PNGs")
    parser.add_argument("--metric", help="metrics.jsonl key to plot instead of the task's default")
    parser.add_argument(
        "--last",
        type=int,
        help=f"final value = mean of this many last logged points (default: {FINAL_POINTS} "
        "for training metrics, 1 for validation metrics)",
    )
    parser.add_argument("--logx", action="store_true", help="log-scale memory-size axis")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the settings as markdown tables on stdout (the written files go to stderr)",
    )
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"--last={args.last} must be at least 1")
    try:
        written, settings = plot_sweeps(
            args.sweep_dirs, args.out, args.metric, args.last, args.logx
        )
    except PlotError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(map(str, written)), file=sys.stderr if args.markdown else sys.stdout)
    if args.markdown:
        figures = by_figure(settings)
        tables = []
        for (group, metric), panel in figures.items():
            tables.append(f"{group}, {metric}:\n\n{markdown_table(panel)}")
            if compared := comparison_table(panel):
                tables.append(compared)
        if len(figures) > 1:
            tables += suite_tables(settings, args.out)
        print("\n\n".join(tables))
    return 0


def comparison_table(panel: Sequence[Setting]) -> str | None:
    """One figure's Expire-Span settings against each other setting: the probability that a run
    of one ends better than a run of the other, with its bootstrap interval (`analysis.aggregate`
    and rliable); None without Expire-Span and another setting, or without rliable."""
    references = [s for s in panel if s.kind == REFERENCE_KIND]
    if not references or len(panel) < 2 or not installed("rliable"):
        return None
    metric = panel[0].metric
    finals = {setting_label(s): [run.final for run in s.runs] for s in panel}
    comparisons = setting_comparisons(
        finals,
        [setting_label(s) for s in references],
        lower_is_better=metric.endswith(LOWER_BETTER),
    )
    single = [label for label, values in finals.items() if len(values) < MIN_COMPARED_RUNS]
    left_out = (
        f"\n\nLeft out, with fewer than {MIN_COMPARED_RUNS} runs (no interval): "
        + ", ".join(single)
        if single
        else ""
    )
    if not comparisons:
        return f"{panel[0].group}, {metric}: no comparison.{left_out}"
    return (
        f"{panel[0].group}, {metric}: each Expire-Span setting against every other, over their "
        f"runs' final {metric} (rliable, {BOOTSTRAP_REPS} bootstrap samples; p: a one-sided "
        "permutation test of the same probability):\n\n"
        + comparison_markdown(comparisons)
        + left_out
    )


def suite_tables(settings: Sequence[Setting], out_dir: Path) -> list[str]:
    """For runs over several tasks, per budget (total_steps: scores after 1M and 10M steps are
    not draws of one distribution): the table of every task (`task_table`) and, for RL runs,
    the rliable aggregate, drawn in OUT_DIR/aggregate.png, or aggregate_<steps>.png for each
    budget where there are several. Within a budget a run's setting is what tells it apart
    from the other runs of that budget, so a memory's runs of one budget share a label. A task
    with no run without memory in a budget starts where those of another budget end."""
    runs = [run for setting in settings for run in setting.runs]
    budgets = sorted({run.total_steps or 0 for run in runs})  # (0: a config without it)
    tables = []
    for budget in budgets:
        alike = [replace(run, setting="") for run in runs if (run.total_steps or 0) == budget]
        alike = label_settings(alike)
        heading, figure = "Every task", out_dir / "aggregate.png"
        if len(budgets) > 1:
            heading, figure = f"Runs of {budget:,} steps", out_dir / f"aggregate_{budget}.png"
        tables.append(f"{heading}:\n\n{task_table(summarize(alike))}")
        baselines = [
            run for run in runs if run.kind == NO_MEMORY and (run.total_steps or 0) != budget
        ]
        try:
            text, drawn = write_aggregate(alike, figure, baselines)
        except AggregateError as error:
            warn("no aggregate across tasks", [str(error)])
            continue
        tables.append(text)
        if drawn:
            print(figure, file=sys.stderr)
    return tables


def write_aggregate(
    runs: Sequence[RunResult], figure: Path, baselines: Sequence[RunResult] = ()
) -> tuple[str, bool]:
    """The rliable tables of RL runs over several tasks (`analysis.aggregate`), each memory
    labelled by its kind and setting, and whether they were drawn in ``figure`` (not without
    two runs of a memory per task); `baselines`: runs without memory at another budget. Refused
    for runs whose metrics have no known range."""
    unknown = sorted({run.metric for run in [*runs, *baselines]} - set(NORMALISED))
    if unknown:
        raise AggregateError(f"no known range for {', '.join(unknown)}, so no normalised score")
    if not installed("rliable"):
        raise AggregateError(
            'the aggregate needs rliable, which is not installed: pip install -e ".[stats]"'
        )
    scores, baseline_scores = ([_score(run) for run in group] for group in (runs, baselines))
    text, result = aggregate_markdown(scores, baselines=baseline_scores)
    if "iqm" not in result:
        return text, False
    _save_png(plot_aggregate(result), figure)
    return text, True


def _score(run: RunResult) -> RunScore:
    kind = " ".join(filter(None, (run.kind, run.setting)))
    return score_run(run.run_dir, run.group, kind, run.seed, run.metric)


if __name__ == "__main__":
    sys.exit(main())
