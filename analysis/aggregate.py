"""Memories compared across seeds and tasks with the field's statistics: `rliable` (Agarwal et
al., *Deep RL at the Edge of the Statistical Precipice*, NeurIPS 2021).

- A run's **final score** is its task metric's mean over the last LAST_FRACTION of its steps,
  normalised to [0, 1]: POPGym's returns (in [-1, 1]) as (r + 1) / 2, success rates as they are.
- Its **MMER** is POPGym's (Morad et al., ICLR 2023): the best mean episode return over
  consecutive windows of at least MMER_WINDOW steps, in the return's own units. (The `mmer`
  a run logs is the best of single log intervals, which a short interval inflates.)
- A task is **learned** when some memory's mean final score is at least LEARNED_GAIN above the
  task's starting level: the mean final score of its runs without memory (`memory=mlp`) where
  there are some, else of its runs without memory at another budget (the suite's 10M runs have
  none of their own), else its runs' mean score over their first logged interval (which is
  below what a policy without memory reaches in a few intervals). An unlearned task is
  reported as such and left out of the aggregates.
- Across seeds and learned tasks: the **IQM** of final scores with a 95% stratified-bootstrap
  interval (runs resampled within each task), and the **probability of improvement** of a
  reference memory over each other one, with its interval. A memory with fewer than
  MIN_COMPARED_RUNS runs per task is named and left out: its interval would have no width.
- Settings of one task (`setting_comparisons`): the probability of improvement with its
  bootstrap interval, and the one-sided p of a permutation test of that same probability; the
  difference is resolved where both show it (the interval clear of 0.5, p at most
  SIGNIFICANCE). With few runs the bootstrap's interval collapses to [1, 1] when the runs
  separate completely, while the test says what so few runs can show: p = 1/20 at best with
  three runs a side, 1/10 with three against two.

Needs the `stats` extra (pip install -e ".[stats]").
"""

from __future__ import annotations

import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from matplotlib.figure import Figure

from training.metrics import METRICS_FILE, read_metrics

LAST_FRACTION = 0.1
MMER_WINDOW = 64_000
LEARNED_GAIN = 0.1  # in normalised units: a tenth of the task's range
BOOTSTRAP_REPS = 2_000  # (rliable's default, 50,000, takes minutes per pair on one core)
CONFIDENCE = 0.95
MIN_COMPARED_RUNS = 2  # a setting compared with another: its runs, at least
PERMUTATIONS = 10_000  # a permutation test's random splits, where there are more than these
SIGNIFICANCE = 0.05  # a comparison of settings is resolved only with a p at most this
REFERENCE_KIND = "expire_span"
NO_MEMORY = "mlp"


class AggregateError(Exception):
    """Runs that cannot be aggregated as asked (uneven seeds, a metric with no known range)."""


@dataclass(frozen=True)
class RunScore:
    """One run's scores: `final` and `start` normalised to [0, 1], `mmer` in return units."""

    task: str
    kind: str
    seed: int
    final: float
    start: float
    mmer: float | None


NORMALISED = ("mmer", "return", "success")  # the task metrics with a known range


def normalise(metric: str, value: float) -> float:
    """A task metric on [0, 1]: POPGym's returns, in [-1, 1], as (r + 1) / 2; rates as they are."""
    if metric in ("return", "mmer"):
        return (value + 1) / 2
    if metric == "success":
        return value
    raise AggregateError(
        f"no known range for the metric {metric!r}: only POPGym's returns and success rates are "
        "normalised and aggregated"
    )


def final_mean(records: Sequence[dict[str, Any]], key: str) -> float:
    """`key`'s mean over the records logged in the last LAST_FRACTION of the run's steps."""
    last_step = records[-1]["step"]
    tail = [r[key] for r in records if r["step"] > (1 - LAST_FRACTION) * last_step and key in r]
    return float(np.mean(tail)) if tail else math.nan


def popgym_mmer(records: Sequence[dict[str, Any]], window: int = MMER_WINDOW) -> float:
    """The best mean episode return over consecutive windows of at least `window` steps, each
    logged interval's return weighted by its episodes; a last window shorter than `window`
    joins the one before it (a run shorter than `window` is one window)."""
    steps = np.diff([0, *(r["step"] for r in records)])
    returns = np.array([r.get("return", math.nan) for r in records], dtype=float)
    episodes = np.array([r.get("episodes", 1.0) for r in records], dtype=float)
    episodes[np.isnan(returns)] = 0.0
    bounds, covered = [0], 0
    for i, length in enumerate(steps):
        covered += length
        if covered >= window:
            bounds.append(i + 1)
            covered = 0
    if covered:  # a short tail joins the last full window (or is the one window of a short run)
        bounds[-1:] = [len(records)] if len(bounds) > 1 else [0, len(records)]
    means = [
        np.nansum(returns[a:b] * episodes[a:b]) / episodes[a:b].sum()
        for a, b in zip(bounds, bounds[1:], strict=False)
        if episodes[a:b].sum() > 0
    ]
    return float(max(means)) if means else math.nan


def score_run(run_dir: str | Path, task: str, kind: str, seed: int, metric: str) -> RunScore:
    """A run's scores from its metrics.jsonl; `metric` is its task metric (`mmer` reads the
    `return` it is the maximum of)."""
    records = read_metrics(Path(run_dir) / METRICS_FILE)
    key = "return" if metric == "mmer" else metric
    first = next((r[key] for r in records if key in r and not math.isnan(r[key])), math.nan)
    return RunScore(
        task=task,
        kind=kind,
        seed=seed,
        final=normalise(key, final_mean(records, key)),
        start=normalise(key, first),
        mmer=popgym_mmer(records) if key == "return" else None,
    )


def starting_level(runs: Sequence[RunScore], baselines: Sequence[RunScore] = ()) -> float:
    """A task's level before memory helps: what its runs without memory end at, where there are
    some (a task solved without memory is not a memory's), else what `baselines` (its runs
    without memory at another budget) end at, else where its runs start."""
    memoryless = [run.final for run in runs if _memoryless(run)]
    memoryless = memoryless or [run.final for run in baselines]
    return float(np.mean(memoryless if memoryless else [run.start for run in runs]))


def learned_tasks(
    scores: Sequence[RunScore], baselines: Sequence[RunScore] = ()
) -> dict[str, bool]:
    """Per task: whether some memory's mean final score is LEARNED_GAIN above its starting level."""
    by_task: dict[str, list[RunScore]] = defaultdict(list)
    for score in scores:
        by_task[score.task].append(score)
    learned = {}
    for task, runs in by_task.items():
        kinds = {run.kind for run in runs if not _memoryless(run)}
        best = max(np.mean([run.final for run in runs if run.kind == kind]) for kind in kinds)
        start = starting_level(runs, [run for run in baselines if run.task == task])
        learned[task] = bool(best >= start + LEARNED_GAIN)
    return learned


def score_matrices(
    scores: Sequence[RunScore], tasks: Sequence[str], value: str = "final"
) -> dict[str, np.ndarray]:
    """Per memory kind, its runs x tasks matrix of `value` (runs ordered by seed); every task
    must have the same number of runs of a kind."""
    matrices = {}
    for kind in sorted({score.kind for score in scores}):
        columns = []
        for task in tasks:
            runs = sorted((s for s in scores if s.kind == kind and s.task == task), key=_seed)
            columns.append([getattr(run, value) for run in runs])
        counts = {task: len(column) for task, column in zip(tasks, columns, strict=True)}
        if len(set(counts.values())) != 1:
            raise AggregateError(
                f"{kind} has {counts} runs per task: the stratified bootstrap needs as many runs "
                "of a memory on every task (finish or leave out the missing runs)"
            )
        matrices[kind] = np.array(columns, dtype=float).T
    return matrices


def iqm_intervals(
    matrices: dict[str, np.ndarray], reps: int = BOOTSTRAP_REPS
) -> dict[str, tuple[float, float, float]]:
    """Per kind: IQM over runs and tasks, and its 95% stratified-bootstrap interval."""
    from rliable import metrics

    return {
        kind: _bootstrap(matrix, lambda x: np.array([metrics.aggregate_iqm(x)]), reps)
        for kind, matrix in matrices.items()
    }


def improvement_intervals(
    matrices: dict[str, np.ndarray], reference: str = REFERENCE_KIND, reps: int = BOOTSTRAP_REPS
) -> dict[str, tuple[float, float, float]]:
    """Per other kind: the probability that `reference` improves on it (a run of `reference`
    scores above one of the other's on the same task, ties counting half, averaged over tasks),
    and its 95% stratified-bootstrap interval."""
    from rliable import metrics

    if reference not in matrices:
        return {}
    return {
        kind: _bootstrap((matrices[reference], matrix), metrics.probability_of_improvement, reps)
        for kind, matrix in matrices.items()
        if kind != reference
    }


class Comparison(NamedTuple):
    """The probability that a run of one setting ends better than a run of another: its point,
    its 95% bootstrap interval, and the p of a permutation test of it, one-sided in the
    direction of the point (above 0.5 or below)."""

    point: float
    low: float
    high: float
    p: float


def setting_comparisons(
    finals: dict[str, Sequence[float]],
    references: Sequence[str],
    lower_is_better: bool = False,
    reps: int = BOOTSTRAP_REPS,
) -> dict[tuple[str, str], Comparison]:
    """One task's settings (e.g. "Expire-Span 1024", "Transformer-XL 512"), each with the final
    metric of its runs: for each setting of `references` and each other setting, the
    probability that the reference improves on it (a run of it ends better than a run of the
    other, ties counting half), its 95% bootstrap interval and its `permutation_p`. The
    probability depends on order only, so the metric needs no range: an error or bits per byte
    is turned round. Settings of fewer than MIN_COMPARED_RUNS runs are compared with none:
    resampling a single run gives an interval of no width, which would read as a resolved
    difference."""
    from rliable import metrics

    sign = -1.0 if lower_is_better else 1.0
    columns = {
        name: sign * np.asarray(values, dtype=float)[:, None]
        for name, values in finals.items()
        if len(values) >= MIN_COMPARED_RUNS
    }
    comparisons = {}
    for reference in references:
        for other in finals:
            if other == reference or reference not in columns or other not in columns:
                continue
            mine, theirs = columns[reference], columns[other]
            point, low, high = _bootstrap((mine, theirs), metrics.probability_of_improvement, reps)
            ahead, behind = (mine, theirs) if point >= 0.5 else (theirs, mine)
            p = permutation_p(ahead[:, 0], behind[:, 0])
            comparisons[reference, other] = Comparison(point, low, high, p)
    return comparisons


def permutation_p(better: np.ndarray, other: np.ndarray) -> float:
    """The one-sided p of `better`'s probability of improvement over `other` where the runs of
    both come from one distribution: the share of the splits of the pooled runs into groups of
    these sizes whose probability is at least the observed one (every split where there are at
    most PERMUTATIONS, else that many drawn at random)."""
    from scipy.stats import permutation_test

    def improvement(x: np.ndarray, y: np.ndarray, axis: int) -> np.ndarray:
        x, y = np.moveaxis(x, axis, -1)[..., :, None], np.moveaxis(y, axis, -1)[..., None, :]
        return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))

    result = permutation_test(
        (better, other),
        improvement,
        vectorized=True,
        n_resamples=PERMUTATIONS,
        alternative="greater",
        rng=np.random.default_rng(0),
    )
    return float(result.pvalue)


def comparison_markdown(comparisons: dict[tuple[str, str], Comparison]) -> str:
    """The comparisons as a table: a row per reference setting, a column per other setting."""
    references = list(dict.fromkeys(reference for reference, _ in comparisons))
    others = list(dict.fromkeys(other for _, other in comparisons))
    rows = ["| P(row > column) [95% CI]: verdict (permutation p) | " + " | ".join(others) + " |"]
    rows.append("|---|" + "---|" * len(others))
    for reference in references:
        cells = []
        for other in others:
            compared = comparisons.get((reference, other))
            cells.append(
                ""
                if compared is None
                else f"{_interval_text(compared)}: {verdict(compared, compared.p)} "
                f"(p {compared.p:.3f})"
            )
        rows.append(f"| {reference} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def verdict(interval: tuple[float, ...], p: float | None = None) -> str:
    """What a probability-of-improvement interval shows: better, worse, or not resolved; with
    the `p` of a permutation test, resolved only where it is at most SIGNIFICANCE as well."""
    _, low, high = interval[:3]
    if p is not None and p > SIGNIFICANCE:
        return "not resolved"
    if low > 0.5:
        return "improves"
    if high < 0.5:
        return "trails"
    return "not resolved"


def aggregate_markdown(
    scores: Sequence[RunScore],
    reference: str = REFERENCE_KIND,
    reps: int = BOOTSTRAP_REPS,
    baselines: Sequence[RunScore] = (),
) -> tuple[str, dict[str, Any]]:
    """The per-task and aggregate tables as markdown, and the numbers behind them; `baselines`
    are runs without memory at another budget, the starting level of tasks with none here."""
    learned = learned_tasks(scores, baselines)
    tasks = sorted(learned)
    kinds = sorted({score.kind for score in scores}, key=lambda k: (k != reference, k))
    per_task = [
        "| task | start | " + " | ".join(kinds) + " |",
        "|---|---|" + "---|" * len(kinds),
    ]
    for task in tasks:
        runs = [s for s in scores if s.task == task]
        start = starting_level(runs, [s for s in baselines if s.task == task])
        cells = []
        for kind in kinds:
            mine = [s for s in runs if s.kind == kind]
            if not mine:
                cells.append("")
                continue
            cell = _range_text([s.final for s in mine])
            mmers = [s.mmer for s in mine if s.mmer is not None]
            if mmers:
                cell += f"; MMER {_range_text(mmers)}"
            cells.append(cell)
        name = task if learned[task] else f"{task} (unlearned)"
        per_task.append(f"| {name} | {start:.3f} | " + " | ".join(cells) + " |")
    aggregated = [task for task in tasks if learned[task]]
    result: dict[str, Any] = {
        "learned": aggregated,
        "unlearned": sorted(set(tasks) - set(aggregated)),
    }
    text = (
        "Final score (normalised, mean of the last 10% of steps) per task: mean [lowest, highest] "
        "over seeds; MMER in return units; start: the final score of the runs without memory, "
        "of another budget where this one has none, else the runs' first interval.\n\n"
        + "\n".join(per_task)
    )
    if not aggregated:
        return text + "\n\nNo task was learned: nothing to aggregate.", result
    kept = [s for s in scores if s.task in aggregated]
    matrices = score_matrices(kept, aggregated)
    absent = [kind for kind in kinds if kind not in matrices]
    single = [
        kind for kind in kinds if kind in matrices and matrices[kind].shape[0] < MIN_COMPARED_RUNS
    ]
    left_out = (
        f"\n\nLeft out of the aggregate, with no runs of the learned tasks: {', '.join(absent)}"
        if absent
        else ""
    )
    if single:
        left_out += (
            f"\n\nLeft out of the aggregate, with fewer than {MIN_COMPARED_RUNS} runs per task "
            f"(a single run resampled has an interval of no width): {', '.join(single)}"
        )
    matrices = {kind: matrix for kind, matrix in matrices.items() if kind not in single}
    if not matrices:
        return text + left_out, result
    result["iqm"] = iqm_intervals(matrices, reps)
    result["improvement"] = improvement_intervals(matrices, reference, reps)
    rows = [
        f"| memory | runs | IQM [95% CI] | P({reference} > memory) [95% CI] |",
        "|---|---|---|---|",
    ]
    for kind in (kind for kind in kinds if kind in matrices):
        iqm = result["iqm"][kind]
        cell = "reference"
        if kind in result["improvement"]:
            improvement = result["improvement"][kind]
            cell = f"{_interval_text(improvement)}: {verdict(improvement)}"
        rows.append(f"| {kind} | {matrices[kind].size} | {_interval_text(iqm)} | {cell} |")
    text += (
        f"\n\nAcross seeds and the {len(aggregated)} learned tasks ({', '.join(aggregated)}; "
        f"unlearned: {', '.join(result['unlearned']) or 'none'}), rliable, {reps} stratified "
        "bootstrap samples:\n\n" + "\n".join(rows) + left_out
    )
    return text, result


def plot_aggregate(result: dict[str, Any], reference: str = REFERENCE_KIND) -> Figure:
    """IQM per memory and the probability that `reference` improves on each, with intervals."""
    figure = Figure(figsize=(9, 3))
    iqm_axes, improvement_axes = figure.subplots(1, 2)
    for axes, values, title in (
        (iqm_axes, result["iqm"], "IQM of final scores"),
        (improvement_axes, result["improvement"], f"P({reference} > memory)"),
    ):
        names = list(values)
        for row, name in enumerate(names):
            point, low, high = values[name]
            axes.plot([low, high], [row, row], linewidth=6, alpha=0.4, color="C0")
            axes.plot([point], [row], "|", markersize=14, color="k")
        axes.set_yticks(range(len(names)), names)
        axes.set_title(title)
        axes.set_ylim(-0.6, len(names) - 0.4)
    improvement_axes.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    improvement_axes.set_xlim(0, 1)
    figure.tight_layout()
    return figure


def _bootstrap(scores: Any, statistic: Any, reps: int) -> tuple[float, float, float]:
    """`statistic` of `scores` (a runs x tasks matrix, or a pair of them) and its 95% interval
    from rliable's stratified bootstrap, seeded afresh for each: an interval does not depend on
    which other memories are compared (the bootstrap of pairs draws from NumPy's global
    generator, which is restored after)."""
    from rliable import library

    global_state = np.random.get_state()
    np.random.seed(0)
    try:
        with warnings.catch_warnings():  # (arch prefers a Generator to rliable's RandomState)
            warnings.simplefilter("ignore", FutureWarning)
            points, intervals = library.get_interval_estimates(
                {"scores": scores},
                statistic,
                reps=reps,
                confidence_interval_size=CONFIDENCE,
                random_state=np.random.RandomState(0),
            )
    finally:
        np.random.set_state(global_state)
    low, high = np.ravel(intervals["scores"])
    return float(np.ravel(points["scores"])[0]), float(low), float(high)


def _memoryless(score: RunScore) -> bool:
    return score.kind.split()[0] == NO_MEMORY


def _seed(score: RunScore) -> int:
    return score.seed


def _range_text(values: Sequence[float]) -> str:
    return f"{np.mean(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def _interval_text(interval: tuple[float, ...]) -> str:
    point, low, high = interval[:3]
    return f"{point:.3f} [{low:.3f}, {high:.3f}]"
