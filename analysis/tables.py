"""The runs and settings as tables: runs.csv and settings.csv, and the markdown that
`python -m analysis.plot --markdown` prints: a table per figure, the comparison of its
Expire-Span settings with the others, and for a suite of tasks a table of every task and the
rliable aggregate (`analysis.aggregate`)."""

from __future__ import annotations

import csv
import math
import sys
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

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
from analysis.figures import save_png
from analysis.results import RunResult
from analysis.settings import (
    KIND_STYLES,
    Setting,
    by_figure,
    label_settings,
    memory_order,
    setting_label,
    summarize,
    warn,
)
from training.extras import installed
from training.files import atomic_open

LOWER_BETTER = ("error", "bpb", "loss")  # metrics (by their ending) where less is better
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


def markdown_tables(
    settings: Sequence[Setting], out_dir: Path, reps: int = BOOTSTRAP_REPS
) -> list[str]:
    """What `--markdown` prints: each figure's table and comparison, then for several figures
    the suite's (`suite_tables`, whose aggregate figures go to OUT_DIR); every interval from
    ``reps`` bootstrap samples."""
    figures = by_figure(settings)
    tables = []
    for (group, metric), panel in figures.items():
        tables.append(f"{group}, {metric}:\n\n{markdown_table(panel)}")
        if compared := comparison_table(panel, reps):
            tables.append(compared)
    if len(figures) > 1:
        tables += suite_tables(settings, out_dir, reps)
    return tables


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


def comparison_table(panel: Sequence[Setting], reps: int = BOOTSTRAP_REPS) -> str | None:
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
        reps=reps,
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
        f"runs' final {metric} (rliable, {reps} bootstrap samples; p: a one-sided "
        "permutation test of the same probability):\n\n"
        + comparison_markdown(comparisons)
        + left_out
    )


def suite_tables(
    settings: Sequence[Setting], out_dir: Path, reps: int = BOOTSTRAP_REPS
) -> list[str]:
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
            text, drawn = write_aggregate(alike, figure, baselines, reps)
        except AggregateError as error:
            warn("no aggregate across tasks", [str(error)])
            continue
        tables.append(text)
        if drawn:
            print(figure, file=sys.stderr)
    return tables


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


def write_aggregate(
    runs: Sequence[RunResult],
    figure: Path,
    baselines: Sequence[RunResult] = (),
    reps: int = BOOTSTRAP_REPS,
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
    text, result = aggregate_markdown(scores, baselines=baseline_scores, reps=reps)
    if "iqm" not in result:
        return text, False
    save_png(plot_aggregate(result), figure)
    return text, True


def _score(run: RunResult) -> RunScore:
    kind = " ".join(filter(None, (run.kind, run.setting)))
    return score_run(run.run_dir, run.group, kind, run.seed, run.metric)


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
