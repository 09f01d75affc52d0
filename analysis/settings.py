"""Runs grouped into settings: the runs of one memory kind whose configs differ only in their
seed and bookkeeping are repeats of one setting, reported as its mean and spread over seeds."""

from __future__ import annotations

import math
import os
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from analysis.results import NotReadyError, PlotError, RunResult, find_run_dirs, read_run

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
KIND_STYLES = {  # label, colour, marker; the order of the memory kinds in tables and figures
    "expire_span": ("Expire-Span", "tab:red", "o"),
    "transformer_xl": ("Transformer-XL", "tab:blue", "s"),
    "adaptive_span": ("Adaptive-Span", "tab:green", "^"),
    "compressive": ("Compressive", "tab:purple", "D"),
    "lstm": ("LSTM", "tab:gray", "x"),
    "gru": ("GRU", "black", "+"),
    "mlp": ("MLP (no memory)", "darkkhaki", "v"),
}


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


def warn(title: str, lines: Sequence[str]) -> None:
    """A heading and its lines (the runs left out, or why a table is missing), on stderr."""
    print(f"{title}:\n  " + "\n  ".join(lines), file=sys.stderr)


def label_settings(results: Sequence[RunResult]) -> list[RunResult]:
    """Fill in each run's `setting`: the config values, other than the seed, bookkeeping,
    memory.kind and memory.max_span, that differ between the runs of its kind and figure (a key
    an older run's config lacks counts as the trainer's default, which `read_run` fills in)."""
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


def _differing_keys(runs: Sequence[RunResult]) -> list[str]:
    keys = sorted({key for run in runs for key in run.config})
    return [
        key
        for key in keys
        if key not in (*BOOKKEEPING_KEYS, "memory.kind", "memory.max_span")
        and not key.startswith(BOOKKEEPING_GROUPS)
        and len({repr(run.config.get(key)) for run in runs}) > 1
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
            *memory_order(s),
            math.inf if s.memory_size is None else s.memory_size[0],
            s.setting,
        ),
    )


def memory_order(setting: Setting) -> tuple[int, str, float]:
    """Known kinds first in KIND_STYLES' order, then by name; within a kind, by span."""
    kinds = list(KIND_STYLES)
    known = kinds.index(setting.kind) if setting.kind in kinds else len(kinds)
    return known, setting.kind, math.inf if setting.max_span is None else setting.max_span


def by_figure(settings: Iterable[Setting]) -> dict[tuple[str, str], list[Setting]]:
    """The settings of each figure, a (group, metric), in their order."""
    figures: dict[tuple[str, str], list[Setting]] = {}
    for s in settings:
        figures.setdefault((s.group, s.metric), []).append(s)
    return figures


def setting_label(setting: Setting, with_span: bool = True) -> str:
    """A memory setting's name in a table: "Transformer-XL 200 ramp=2", "GRU" (without the span
    where the table has a column for it)."""
    label = KIND_STYLES.get(setting.kind, (setting.kind,))[0]
    span = "" if setting.max_span is None or not with_span else str(setting.max_span)
    return " ".join(part for part in (label, span, setting.setting) if part)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0
