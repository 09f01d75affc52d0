"""Metrics: one JSON line per logging interval in RUN_DIR/metrics.jsonl, mirrored to W&B.

The JSONL file is the record that needs no network: every line is a JSON object with an
integer "step" and plain numbers (NaN and infinities are written as null), flushed and
fsynced as soon as it is logged. Weights & Biases gets the same dicts when `wandb.mode` is
offline (the default: files under RUN_DIR/wandb, upload later with `wandb sync`) or online.

On resume from a checkpoint taken at step S, lines with step > S are dropped first, and the
W&B run id stored in RUN_DIR/wandb_run_id is reused, so the metrics continue where the
checkpoint left off, with nothing lost or repeated.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import os
import secrets
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from training.config import ConfigError, check_choice
from training.files import atomic_open, reporting_disk_full
from training.run_dir import CHECKPOINT_FILE, save_resolved_config

METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_run_id"
WANDB_MODES = ("disabled", "offline", "online")
WANDB_DEFAULTS: dict[str, Any] = {
    "mode": "offline",
    "project": "expire-span-agents",
    "entity": None,
    "name": None,
    "group": None,
    "tags": [],
}

log = logging.getLogger(__name__)


def check_wandb_config(wandb_cfg: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate the `wandb` config group and fill in defaults for missing keys."""
    given = _to_dict(wandb_cfg) if wandb_cfg is not None else {}
    unknown = sorted(set(given) - set(WANDB_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"unknown wandb option(s) {', '.join(unknown)}; known: {', '.join(WANDB_DEFAULTS)}"
        )
    options = {**WANDB_DEFAULTS, **given}
    check_choice("wandb.mode", options["mode"], WANDB_MODES)
    if isinstance(options["tags"], str):
        raise ConfigError(f"wandb.tags={options['tags']} must be a list, e.g. wandb.tags=[a,b]")
    return options


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read a metrics.jsonl file; a last line cut off by a crash (no newline yet) is ignored."""
    path = Path(path)
    records = []
    with open(path) as file:
        for number, line in enumerate(file, start=1):
            if not line.endswith("\n"):
                break
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number} is not a JSON line: {error}") from error
    return records


def truncate_metrics(path: str | os.PathLike, step: int) -> None:
    """Keep only the lines with step <= `step` (rewritten atomically); no file is fine."""
    path = Path(path)
    if not path.exists():
        return
    kept = [record for record in read_metrics(path) if record["step"] <= step]
    with atomic_open(path, "w") as file:
        file.writelines(json.dumps(record, allow_nan=False) + "\n" for record in kept)


class SpanStats:
    """Per-layer statistics of the expire-spans e_i given to new memories over a logging
    interval: mean, max and the fraction near 0 (e_i < 1 step: the memory lives only for its
    ramp of R steps). Collapsing spans show here before the task metric falls."""

    NEAR_ZERO = 1.0
    CALLS_PER_SUM = 256  # calls kept before they are summed: acting adds a few spans per step

    def __init__(self) -> None:
        self._count = 0
        self._sum = self._near_zero = self._max = torch.zeros(0)
        self._kept: list[Sequence[torch.Tensor]] = []

    def add(self, spans: Sequence[torch.Tensor] | None) -> None:
        """Adds one call's spans, ``CoreOutput.spans`` (None for kinds without spans)."""
        if spans is None:
            return
        self._kept.append(spans)
        if len(self._kept) == self.CALLS_PER_SUM:
            self._sum_kept()

    def _sum_kept(self) -> None:
        """Folds the kept calls' spans into the interval's statistics, in one pass."""
        if not self._kept:
            return
        layers = zip(*self._kept, strict=True)
        span = torch.stack([torch.cat([s.reshape(-1) for s in layer]) for layer in layers])
        span = span.double()  # (layers, memories)
        near_zero = (span < self.NEAR_ZERO).sum(1)
        if self._count == 0:
            self._sum, self._near_zero, self._max = span.sum(1), near_zero, span.amax(1)
        else:
            self._sum = self._sum + span.sum(1)
            self._near_zero = self._near_zero + near_zero
            self._max = self._max.maximum(span.amax(1))
        self._count += span.shape[1]
        self._kept = []

    def state_dict(self) -> dict[str, Any]:
        """The interval's statistics so far (to resume a run within an interval)."""
        self._sum_kept()
        return {
            "count": self._count,
            "sum": self._sum,
            "near_zero": self._near_zero,
            "max": self._max,
        }

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        self._kept = []
        self._count = saved["count"]
        self._sum, self._near_zero, self._max = saved["sum"], saved["near_zero"], saved["max"]

    def summary(self) -> dict[str, float]:
        """``span/l{layer}_mean``, ``_max`` and ``_near_zero`` since the last summary (empty
        when no spans were added), then forget them."""
        self._sum_kept()
        metrics = {}
        if self._count:
            columns = (self._sum.tolist(), self._near_zero.tolist(), self._max.tolist())
            rows = zip(*columns, strict=True)
            for layer, (total, near_zero, largest) in enumerate(rows):
                metrics[f"span/l{layer}_mean"] = total / self._count
                metrics[f"span/l{layer}_max"] = largest
                metrics[f"span/l{layer}_near_zero"] = near_zero / self._count
        self._count = 0
        return metrics


class UpdateMeans:
    """What the updates of a logging interval report, as means over them (the largest for the
    keys of ``maxima``), and the interval's environment steps per second (``sps``); with
    ``count_skipped``, also how many of its updates were undone (``skipped_updates``)."""

    def __init__(self, maxima: Sequence[str] = (), count_skipped: bool = False) -> None:
        self.maxima, self.count_skipped = tuple(maxima), count_skipped
        self._sums: dict[str, float] = {}
        self._count = self._steps = self._skipped = 0
        self._started = time.perf_counter()

    def add(self, values: Mapping[str, float], steps: int) -> None:
        """One update's ``values``, after ``steps`` environment steps."""
        for key, value in values.items():
            combine = max if key in self.maxima else operator.add
            self._sums[key] = combine(self._sums[key], value) if key in self._sums else value
        self._count, self._steps = self._count + 1, self._steps + steps

    def skip(self, values: Mapping[str, float], steps: int) -> None:
        """An update that was undone (`nonfinite=skip`): its steps count, its ``values`` do
        not, but their keys are kept (NaN in an interval whose updates were all skipped)."""
        for key in values:
            self._sums.setdefault(key, 0.0)
        self._skipped, self._steps = self._skipped + 1, self._steps + steps

    def summary(self) -> dict[str, float]:
        """The means since the last summary and ``sps``, then forget them."""
        if self._count:
            metrics = {
                key: value if key in self.maxima else value / self._count
                for key, value in self._sums.items()
            }
        else:  # every update of the interval was skipped
            metrics = dict.fromkeys(self._sums, math.nan)
        metrics["sps"] = self._steps / (time.perf_counter() - self._started)
        if self.count_skipped:
            metrics["skipped_updates"] = self._skipped
        self._sums, self._count, self._steps, self._skipped = {}, 0, 0, 0
        self._started = time.perf_counter()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The interval's sums so far (to resume a run within an interval)."""
        return {
            "sums": dict(self._sums),
            "count": self._count,
            "steps": self._steps,
            "skipped": self._skipped,
        }

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        self._sums, self._count, self._steps = dict(saved["sums"]), saved["count"], saved["steps"]
        self._skipped = saved.get("skipped", 0)  # (checkpoints from before skipping had none)


def start_logging(
    resources: ExitStack,
    run_dir: str | os.PathLike,
    cfg: DictConfig,
    is_main: bool,
    checkpoint: Mapping | None,
) -> MetricsLogger:
    """Writes the run's resolved config (main rank) and opens its metrics logger, continuing
    the checkpoint's run if any; `resources` closes the logger on every way out."""
    if is_main:
        save_resolved_config(run_dir, cfg)
    resume_step = checkpoint["step"] if checkpoint else None
    logger = MetricsLogger(run_dir, cfg, enabled=is_main, resume_step=resume_step)
    return resources.enter_context(logger)


class MetricsLogger:
    """Appends metric dicts to RUN_DIR/metrics.jsonl and W&B; a no-op when not `enabled`.

    `cfg` is the run's config: its `wandb` group (mode, project, entity, name, group, tags)
    sets up W&B, and the whole of it, resolved, becomes the W&B run's config. Pass
    `enabled=dist.is_main` so only rank 0 logs, and `resume_step=checkpoint["step"]` when
    resuming; without it the run starts afresh and an old metrics.jsonl is removed.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        cfg: Mapping[str, Any] | None = None,
        *,
        resume_step: int | None = None,
        enabled: bool = True,
    ) -> None:
        wandb_options = check_wandb_config(cfg.get("wandb") if cfg is not None else None)
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self._wandb_run = None
        if not enabled:
            return
        if resume_step is None:
            self.path.unlink(missing_ok=True)
        else:
            truncate_metrics(self.path, resume_step)
        self._file = open(self.path, "a")
        if wandb_options["mode"] != "disabled":
            self._wandb_run = self._start_wandb(wandb_options, cfg, resume_step is not None)

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Write one line {"step": step, **metrics} and send the same dict to W&B."""
        if not self.enabled:
            return
        if "step" in metrics:
            raise ValueError("pass the step as log(metrics, step=...), not inside metrics")
        record = {"step": int(step)}
        record.update((key, _to_number(key, value)) for key, value in metrics.items())
        line = json.dumps(
            {key: value if math.isfinite(value) else None for key, value in record.items()},
            allow_nan=False,
        )
        checkpoint = self.run_dir / CHECKPOINT_FILE
        intact = "the lines before it are intact" + (
            f", and so is {checkpoint}, the last checkpoint: free space, then resume=true"
            if checkpoint.exists()
            else ""
        )
        with reporting_disk_full(self._file.name, intact):
            self._file.write(line + "\n")
            self._file.flush()
            os.fsync(self._file.fileno())
        if self._wandb_run is not None:
            self._wandb_run.log(record)

    def close(self, exit_code: int = 0) -> None:
        """Close the file and finish the W&B run (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._wandb_run is not None:
            self._wandb_run.finish(exit_code=exit_code)
            self._wandb_run = None

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, exc_type: Any, exc: Any, traceback: Any) -> None:
        self.close(exit_code=0 if exc_type is None else 1)

    def _start_wandb(
        self, options: dict[str, Any], cfg: Mapping[str, Any] | None, resuming: bool
    ) -> Any:
        # W&B suggests its LLM tracer when a module named `agents` is loaded (the OpenAI
        # Agents SDK's name, and this project's); that is noise here. A user's setting wins.
        os.environ.setdefault("WANDB_DISABLE_WEAVE", "true")
        import wandb  # imported only when used: it takes a while to load

        id_file = self.run_dir / WANDB_ID_FILE
        if resuming and id_file.is_file():
            run_id = id_file.read_text().strip()
        else:
            run_id = secrets.token_hex(6)
            with atomic_open(id_file, "w") as file:
                file.write(run_id + "\n")
        offline = options["mode"] == "offline"
        run = wandb.init(
            mode=options["mode"],
            project=options["project"],
            entity=options["entity"],
            name=options["name"],
            group=options["group"],
            tags=list(options["tags"]) or None,
            config=_to_dict(cfg) if cfg is not None else None,
            dir=str(self.run_dir),
            id=run_id,
            resume=None if offline else "allow",  # offline runs append by id; W&B warns on "allow"
            # Offline, W&B's banner only says where the files are: one log line says it instead.
            settings=wandb.Settings(silent=offline),
        )
        run.define_metric("*", step_metric="step")
        if offline:
            sync_dir = run.settings.sync_dir
            log.info("W&B offline run in %s; upload it with: wandb sync %s", sync_dir, sync_dir)
        return run


def _to_dict(cfg: Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)


def _to_number(key: str, value: Any) -> float | int:
    """Python number from a bool, int, float, NumPy scalar or one-element tensor."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool):
        return int(value)
    if not isinstance(value, (int, float)):
        raise TypeError(f"metric {key!r} is {value!r}; metrics are numbers")
    return value
