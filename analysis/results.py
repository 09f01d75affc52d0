"""What a run directory says of its run: one row of `analysis.plot`'s runs.csv (RunResult),
found under sweep directories and read from the run's config.yaml and metrics.jsonl.

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

import functools
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from agents import BASELINE_KINDS
from analysis.runs import LM, run_kind
from envs.registry import NAMED_ENVS
from training.metrics import METRICS_FILE, read_metrics
from training.run_dir import CONFIG_FILE, EVAL_FILE

FINAL_POINTS = 5
MEMORY_SIZE = "memory_size"
EVAL_PREFIXES = ("valid_", "test_")  # metrics from full evaluation passes: the last one counts
RUNNING_MAXIMA = ("mmer",)  # the best so far: the last one counts too
TEXT_TASKS = ("enwik8", "text")
RETURN = "return"  # the interval mean episode return, the series MMER is the maximum of
HOLD_TOLERANCE = 0.1  # POPGym returns are normalised and success is a rate: a tenth is a real drop
# An interval within this of the best has reached it: a plateau's interval means differ by noise,
# so its first interval, not the one that happens to round highest, is where the best begins.
PLATEAU = 0.01
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


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
    chosen = next((key for key in candidates if logged_values(records, key)), None)
    if chosen is None:
        raise NotReadyError(f"{run_dir}: no values of {' or '.join(candidates)} logged yet")
    if last is None:
        last = 1 if chosen.startswith(EVAL_PREFIXES) or chosen in RUNNING_MAXIMA else FINAL_POINTS
    memory_sizes = logged_values(records, memory_size_key(chosen, records))
    returns = logged_values(records, RETURN)
    learned = logged_values(records, RETURN if chosen in RUNNING_MAXIMA else chosen)
    return RunResult(
        run_dir=str(run_dir),
        group=group,
        kind=kind,
        max_span=None if kind in BASELINE_KINDS else OmegaConf.select(cfg, "memory.max_span"),
        seed=seed,
        setting="",
        metric=chosen,
        final=_mean_of_last(logged_values(records, chosen), last),
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
        prefix + MEMORY_SIZE
        if prefix and logged_values(records, prefix + MEMORY_SIZE)
        else MEMORY_SIZE
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


def logged_values(records: list[dict[str, Any]], key: str) -> list[float]:
    """The logged values of `key`, skipping intervals where it was absent or null."""
    return [r[key] for r in records if isinstance(r.get(key), (int, float))]


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


def _mean_of_last(values: list[float], count: int) -> float:
    tail = values[-count:]
    return math.fsum(tail) / len(tail)


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
