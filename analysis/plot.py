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

A run's final metric: RL metrics are logged per interval and noisy, so it is the mean of the
last FINAL_POINTS values; LM evaluation metrics are full passes over a split, and MMER is a
running maximum, so for those it is the last one. Its memory size is averaged over the same
records: `test_memory_size` or `valid_memory_size` (memory during that evaluation pass) for
evaluation metrics, `memory_size` otherwise. The metric is `success` on Corridor,
`rooms_reached` on Portal, `mmer` on env=gym and env=popgym, `return` on other RL envs; on
LM tasks the test split's score that a finished run leaves in RUN_DIR/eval.json (what the
paper reports: bits per byte on enwik8/text, accuracy or error on the other tasks), or, for a
run without it (stopped, or `eval.after_training=false`), the last validation pass's.
A run's training time is the sum of its logged intervals (steps over steps per second; an
LM run's tokens over tokens per second): checkpoints and evaluations are not counted.

An RL run's last return is its last logged interval `return`. It *held* what it learned if no
interval after it first came within PLATEAU of its best is more than HOLD_TOLERANCE below the
best, in the metric's units (higher is better), judged on the metric's own series, or for
MMER on the `return` series MMER is the running maximum of; LM runs leave both unknown.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import os
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure  # drawn with Agg, without pyplot's global state
from omegaconf import OmegaConf

from agents import BASELINE_KINDS
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
from analysis.runs import LM, run_kind
from envs.registry import NAMED_ENVS
from training import CONFIG_FILE, EVAL_FILE, METRICS_FILE, atomic_open, read_metrics
from training.extras import installed

FINAL_POINTS = 5
MEMORY_SIZE = "memory_size"
EVAL_PREFIXES = ("valid_", "test_")  # metrics from full evaluation passes: the last one counts
RUNNING_MAXIMA = ("mmer",)  # the best so far: the last one counts too
TEXT_TASKS = ("enwik8", "text")
LOWER_BETTER = ("error", "bpb", "loss")  # metrics (by their ending) where less is better
RETURN = "return"  # the interval mean episode return, the series MMER is the maximum of
HOLD_TOLERANCE = 0.1  # POPGym returns are normalised and success is a rate: a tenth is a real drop
# An interval within this of the best has reached it: a plateau's interval means differ by noise,
# so its first interval, not the one that happens to round highest, is where the best begins.
PLATEAU = 0.01
# Config keys that do not change what a run learns; runs differing only in these (and the
# seed) are repeats of one setting.
BOOKKEEPING_KEYS = (
    "seed",
    "mode",
    "device",
    "torch_threads",
    "resume",
    "checkpoint",
    "log_interval",
    "checkpoint_interval",
    "checkpoint_keep",
    "task.cache_dir",
    "task.data_dir",
)
BOOKKEEPING_GROUPS = ("wandb.", "eval.")
CONFIGS = Path(__file__).resolve().parents[1] / "configs"
KIND_STYLES = {  # label, colour, marker
    "expire_span": ("Expire-Span", "tab:red", "o"),
    "transformer_xl": ("Transformer-XL", "tab:blue", "s"),
    "adaptive_span": ("Adaptive-Span", "tab:green", "^"),
    "compressive": ("Compressive", "tab:purple", "D"),
    "lstm": ("LSTM", "tab:gray", "x"),
    "gru": ("GRU", "black", "+"),
    "mlp": ("MLP (no memory)", "darkkhaki", "v"),
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
    "mmer": "MMER (best interval mean return)",
    "valid_bpb": "validation bits per byte (lower is better)",
    "valid_accuracy": "validation accuracy",
    "valid_error": "validation error (lower is better)",
    "test_bpb": "test bits per byte (lower is better)",
    "test_accuracy": "test accuracy",
    "test_error": "test error (lower is better)",
}


class PlotError(Exception):
    """Input the tool cannot use; the message says what was wrong."""


class NotReadyError(PlotError):
    """A run with nothing to plot yet (no config or metrics written); skipped with a warning."""


@dataclass(frozen=True)
class RunResult:
    """One run's row in runs.csv and faint point in the figure."""

    run_dir: str
    group: str  # the task (env config, Gymnasium id or LM task): one figure per group
    kind: str
    max_span: int | None
    seed: int
    setting: str  # other config values that tell this run's setting apart, "" if none
    metric: str
    final: float
    memory_size: float | None
    minutes: float | None  # training time, the sum of the logged intervals
    last_return: float | None  # the last logged interval return (RL runs)
    held: bool | None  # no interval far below the best after it (RL runs); see held_best
    steps: int  # last logged step
    total_steps: int | None  # the run's config; steps < total_steps: still running or stopped
    config: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # flat

    @property
    def finished(self) -> bool:
        return self.total_steps is None or self.steps >= self.total_steps


RUN_COLUMNS = [f.name for f in fields(RunResult) if f.name != "config"]


@dataclass(frozen=True)
class Setting:
    """Runs of one memory kind that differ only in their seed: one mean point in the figure."""

    group: str
    metric: str
    kind: str
    max_span: int | None
    setting: str
    runs: tuple[RunResult, ...]

    @property
    def final(self) -> tuple[float, float]:
        """Mean and standard deviation over the runs (0 for a single run)."""
        return _mean_std([run.final for run in self.runs])

    @property
    def memory_size(self) -> tuple[float, float] | None:
        return self._over_runs("memory_size")

    @property
    def minutes(self) -> tuple[float, float] | None:
        return self._over_runs("minutes")

    @property
    def last_return(self) -> tuple[float, float] | None:
        return self._over_runs("last_return")

    def _over_runs(self, name: str) -> tuple[float, float] | None:
        """Mean and standard deviation of a RunResult field over the runs that have it."""
        known = [getattr(run, name) for run in self.runs if getattr(run, name) is not None]
        return _mean_std(known) if known else None

    @property
    def held(self) -> tuple[int, int] | None:
        """How many runs held what they learned, of the runs where that is known."""
        known = [run.held for run in self.runs if run.held is not None]
        return (sum(known), len(known)) if known else None

    @property
    def seeds(self) -> list[int]:
        return sorted(run.seed for run in self.runs)

    @property
    def steps(self) -> int:
        """The fewest steps any of the runs logged."""
        return min(run.steps for run in self.runs)


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


def find_run_dirs(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Run directories under the given sweep or run directories, in job-number order.

    A run directory holds config.yaml, or is a Hydra job directory (it has .hydra/) whose
    run stopped before writing one; the search does not look inside run directories.
    A run reached through two of the paths is listed once.
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
    return _unique_by_resolved_path(found)


def read_run(run_dir: Path, metric: str | None = None, last: int | None = None) -> RunResult:
    """A run's row of runs.csv (final metric, memory size, ...); NotReadyError if it has no
    usable metrics yet.

    `last`: how many final logged values to average; by default FINAL_POINTS for metrics
    logged during training and 1 for validation metrics (see the module docstring).
    """
    if not (run_dir / CONFIG_FILE).is_file():
        raise NotReadyError(f"{run_dir}: no {CONFIG_FILE} (the run stopped before it started?)")
    try:
        cfg = OmegaConf.load(run_dir / CONFIG_FILE)
    except yaml.YAMLError as error:
        raise PlotError(f"{run_dir / CONFIG_FILE} is not valid YAML: {error}") from error
    trainer = run_kind(cfg)
    is_lm = trainer is LM
    name = str(_config_value(cfg, "task.name" if is_lm else "env.name", run_dir))
    group = name
    if not is_lm and name in NAMED_ENVS and NAMED_ENVS[name].any_gym_id:  # the id's part after ":"
        group = str(_config_value(cfg, "env.id", run_dir)).rpartition(":")[2]
    kind = str(_config_value(cfg, "memory.kind", run_dir))
    seed = _config_value(cfg, "seed", run_dir)
    candidates = (metric,) if metric else _metric_candidates(name, is_lm)
    metrics_path = run_dir / METRICS_FILE
    if not metrics_path.is_file():
        raise NotReadyError(f"{run_dir}: no {METRICS_FILE} yet")
    try:
        records = read_metrics(metrics_path)
    except ValueError as error:
        raise PlotError(str(error)) from error
    if not records:
        raise NotReadyError(f"{run_dir}: {METRICS_FILE} is empty")
    minutes = training_minutes(records, lm_tokens_per_step(cfg) if is_lm else None)
    if is_lm:
        records += final_test_scores(run_dir)
    chosen = next((key for key in candidates if _series(records, key)), None)
    if chosen is None:
        raise NotReadyError(f"{run_dir}: no values of {' or '.join(candidates)} logged yet")
    if last is None:
        last = 1 if chosen.startswith(EVAL_PREFIXES) or chosen in RUNNING_MAXIMA else FINAL_POINTS
    memory_sizes = _series(records, memory_size_key(chosen, records))
    returns = _series(records, RETURN)
    learned = _series(records, RETURN if chosen in RUNNING_MAXIMA else chosen)
    return RunResult(
        run_dir=str(run_dir),
        group=group,
        kind=kind,
        max_span=None if kind in BASELINE_KINDS else OmegaConf.select(cfg, "memory.max_span"),
        seed=seed,
        setting="",
        metric=chosen,
        final=_mean_of_last(_series(records, chosen), last),
        memory_size=_mean_of_last(memory_sizes, last) if memory_sizes else None,
        minutes=minutes,
        last_return=returns[-1] if returns else None,
        held=None if is_lm or not learned else held_best(learned),
        steps=int(records[-1]["step"]),
        total_steps=OmegaConf.select(cfg, "total_steps"),
        config=_top_defaults(trainer.config_name) | _flatten(OmegaConf.to_container(cfg)),
    )


@functools.cache
def _top_defaults(config_name: str) -> dict[str, Any]:
    """The values a trainer's top config file (configs/rl.yaml, lm.yaml) sets, flat. A key added
    there after a run was made keeps the old behaviour as its default, so a run whose saved
    config lacks it ran with that default: its setting is not told apart by the key's absence."""
    top = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{config_name}.yaml"))
    return _flatten({key: value for key, value in top.items() if key not in ("defaults", "hydra")})


def lm_tokens_per_step(cfg: Any) -> int | None:
    """The tokens per update that an LM run's `tokens_per_s` counts: batch_size blocks."""
    batch, block = OmegaConf.select(cfg, "batch_size"), OmegaConf.select(cfg, "memory.block_len")
    return batch * block if batch and block else None


def final_test_scores(run_dir: Path) -> list[dict[str, Any]]:
    """The test split's scores of a finished LM run (RUN_DIR/eval.json) as one more record of
    its metrics, or none where it has no such file or it scored another split."""
    path = run_dir / EVAL_FILE
    if not path.is_file():
        return []
    try:
        evaluation = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise PlotError(f"{path} is not valid JSON: {error}") from error
    scores = {key: value for key, value in evaluation.items() if key.startswith("test_")}
    return [{"step": evaluation["step"], **scores}] if scores else []


def memory_size_key(metric: str, records: list[dict[str, Any]]) -> str:
    """The memory size measured with the metric: valid_memory_size for valid_bpb, if logged."""
    prefix = next((p for p in EVAL_PREFIXES if metric.startswith(p)), "")
    return (
        prefix + MEMORY_SIZE if prefix and _series(records, prefix + MEMORY_SIZE) else MEMORY_SIZE
    )


def training_minutes(records: list[dict[str, Any]], tokens_per_step: int | None) -> float | None:
    """The sum of the logged intervals' durations: their steps over their steps per second (RL
    runs' `sps`), or their tokens over their tokens per second (LM runs' `tokens_per_s`, of
    ``tokens_per_step`` per update); None where an interval logs neither."""
    seconds, previous = 0.0, 0
    for record in records:
        if record.get("sps"):
            seconds += (record["step"] - previous) / record["sps"]
        elif record.get("tokens_per_s") and tokens_per_step:
            seconds += (record["step"] - previous) * tokens_per_step / record["tokens_per_s"]
        else:
            return None
        previous = record["step"]
    return seconds / 60


def held_best(values: Sequence[float]) -> bool:
    """Whether a learning series kept its best: no value after it first came within PLATEAU
    of its best more than HOLD_TOLERANCE below the best (a run that peaks then collapses did
    not hold, even if it climbs back to a value that rounds higher)."""
    best = max(values)
    reached = next(i for i, value in enumerate(values) if best - value <= PLATEAU)
    return all(best - value <= HOLD_TOLERANCE for value in values[reached + 1 :])


def label_settings(results: Sequence[RunResult]) -> list[RunResult]:
    """Fill in each run's `setting`: the config values, other than the seed, bookkeeping,
    memory.kind and memory.max_span, that differ between the runs of its kind and figure (a key
    an older run's config lacks counts as the trainer's default, `_top_defaults`)."""
    peers: dict[tuple[str, str, str], list[RunResult]] = {}
    for run in results:
        peers.setdefault((run.group, run.metric, run.kind), []).append(run)
    differing = {key: _differing_keys(runs) for key, runs in peers.items()}
    return [
        replace(
            run,
            setting=" ".join(
                f"{key}={run.config.get(key)}" for key in differing[run.group, run.metric, run.kind]
            ),
        )
        for run in results
    ]


def summarize(results: Iterable[RunResult]) -> list[Setting]:
    """Group labelled runs into settings, ordered by figure, memory kind, span, memory size."""
    grouped: dict[tuple, list[RunResult]] = {}
    for run in results:
        key = (run.group, run.metric, run.kind, run.max_span, run.setting)
        grouped.setdefault(key, []).append(run)
    settings = [Setting(*key, runs=tuple(runs)) for key, runs in grouped.items()]
    return sorted(
        settings,
        key=lambda s: (
            s.group,
            s.metric,
            *_memory_order(s),
            math.inf if s.memory_size is None else s.memory_size[0],
            s.setting,
        ),
    )


def _memory_order(setting: Setting) -> tuple[int, str, float]:
    """Known kinds first in KIND_STYLES' order, then by name; within a kind, by span."""
    kinds = list(KIND_STYLES)
    known = kinds.index(setting.kind) if setting.kind in kinds else len(kinds)
    return known, setting.kind, math.inf if setting.max_span is None else setting.max_span


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
    in_order = sorted(settings, key=lambda s: (*_memory_order(s), s.setting))
    columns = list(dict.fromkeys(setting_label(s) for s in in_order))
    with_held = any(s.held is not None for s in settings)
    header = ["task", *columns, "memory size: " + ", ".join(columns)]
    header += ["held: " + ", ".join(columns)] if with_held else []
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (group, metric), panel in _by_figure(settings).items():
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


def collect(
    sweep_dirs: Sequence[str | os.PathLike], metric: str | None = None, last: int | None = None
) -> list[RunResult]:
    """Every run with usable metrics, labelled with its setting; warns on stderr about runs
    skipped (nothing logged yet) and runs that have not reached their total_steps."""
    results, skipped = [], []
    for run_dir in find_run_dirs(sweep_dirs):
        try:
            results.append(read_run(run_dir, metric, last))
        except NotReadyError as reason:
            skipped.append(str(reason))
    if skipped:
        warn(f"skipped {len(skipped)} run(s) with nothing to plot yet", skipped)
    if not results:
        raise PlotError("no run has usable metrics yet")
    unfinished = [
        f"{r.run_dir}: step {r.steps:,} of {r.total_steps:,}" for r in results if not r.finished
    ]
    if unfinished:
        warn(
            f"{len(unfinished)} run(s) still running or stopped early, plotted as they are",
            unfinished,
        )
    return label_settings(results)


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
    for (group, group_metric), panel in _by_figure(settings).items():
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


def _by_figure(settings: Iterable[Setting]) -> dict[tuple[str, str], list[Setting]]:
    figures: dict[tuple[str, str], list[Setting]] = {}
    for s in settings:
        figures.setdefault((s.group, s.metric), []).append(s)
    return figures


def _metric_candidates(name: str, is_lm: bool) -> tuple[str, ...]:
    name = name.lower()
    if is_lm:
        if name in TEXT_TASKS:
            return ("test_bpb", "valid_bpb", "bpb")
        return ("test_accuracy", "test_error", "valid_accuracy", "valid_error", "accuracy", "error")
    return (NAMED_ENVS[name].score,) if name in NAMED_ENVS else ("return",)


def _config_value(cfg: Any, key: str, run_dir: Path) -> Any:
    value = OmegaConf.select(cfg, key, default=None)
    if value is None:
        raise PlotError(
            f"{run_dir / CONFIG_FILE} has no {key}; plot runs written by train_rl.py or train_lm.py"
        )
    return value


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{"memory": {"max_span": 10}} -> {"memory.max_span": 10}; lists become tuples."""
    if isinstance(node, dict):
        flat = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}."))
        return flat
    return {prefix[:-1]: tuple(node) if isinstance(node, list) else node}


def _differing_keys(runs: Sequence[RunResult]) -> list[str]:
    keys = sorted({key for run in runs for key in run.config})
    return [
        key
        for key in keys
        if key not in (*BOOKKEEPING_KEYS, "memory.kind", "memory.max_span")
        and not key.startswith(BOOKKEEPING_GROUPS)
        and len({repr(run.config.get(key)) for run in runs}) > 1
    ]


def _series(records: list[dict[str, Any]], key: str) -> list[float]:
    """The logged values of `key`, skipping intervals where it was absent or null."""
    return [r[key] for r in records if isinstance(r.get(key), (int, float))]


def _mean_of_last(values: list[float], count: int) -> float:
    tail = values[-count:]
    return math.fsum(tail) / len(tail)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _mean_std_text(mean: float, std: float, count: int) -> str:
    return f"{mean:.3g}" if count == 1 else f"{mean:.3g} ± {std:.2g}"


def _spread_text(mean: float, std: float, count: int) -> str:
    """0.99987 ± 0.00001: three decimals, or as many as show the spread's first digit (up to
    six: a spread below that is rounding, shown as 0)."""
    decimals = 3 if std < 1e-6 else max(3, -math.floor(math.log10(std)))
    return f"{mean:.{decimals}f}" + ("" if count == 1 else f" ± {std:.{decimals}f}")


def _size_text(size: tuple[float, float] | None) -> str:
    return "" if size is None else f"{size[0]:.3g}"


def setting_label(setting: Setting, with_span: bool = True) -> str:
    """A memory setting's name in a table: "Transformer-XL 200 ramp=2", "GRU" (without the span
    where the table has a column for it)."""
    label = KIND_STYLES.get(setting.kind, (setting.kind,))[0]
    span = "" if setting.max_span is None or not with_span else str(setting.max_span)
    return " ".join(part for part in (label, span, setting.setting) if part)


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


def _natural_key(path: Path) -> list[Any]:
    """Sort job directories 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in path.parts]


def _unique_by_resolved_path(paths: Iterable[Path]) -> list[Path]:
    seen, unique = set(), []
    for path in paths:
        if path.resolve() not in seen:
            seen.add(path.resolve())
            unique.append(path)
    return unique


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def warn(title: str, lines: Sequence[str]) -> None:
    """A heading and its lines (the runs left out, or why a table is missing), on stderr."""
    print(f"{title}:\n  " + "\n  ".join(lines), file=sys.stderr)


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
        figures = _by_figure(settings)
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
