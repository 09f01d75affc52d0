"""A finished run's report: RUN_DIR/eval.json, the trained model's evaluation, and
RUN_DIR/curves.png, its learning curves drawn from RUN_DIR/metrics.jsonl. The trainers take it
as their last step (eval.after_training), which a run may skip: its directory is whole without
it (checkpoints, metrics, config), so `training/` neither draws nor imports `analysis/`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from omegaconf import DictConfig

from analysis.curves import lm_panels, plot_curves, rl_panels, run_label
from envs.registry import task_metric
from training.files import atomic_open
from training.metrics import METRICS_FILE, read_metrics
from training.run_dir import CURVES_FILE, EVAL_FILE


def report_rl_run(run_dir: Path, cfg: DictConfig, result: Mapping[str, Any]) -> str:
    """An RL run's report: ``result``, its agent's evaluation by each policy
    (`agents.evaluation.evaluate_policies`), and the curves of its task metric, memory size
    and spans against environment steps. Returns the task metric (`envs.registry.task_metric`)."""
    records = read_metrics(run_dir / METRICS_FILE)
    metric = task_metric(cfg.env.name, records)
    runs = [(run_label(cfg), records)]
    save_report(run_dir, result, plot_curves(runs, rl_panels(runs, [metric])))
    return metric


def report_lm_run(run_dir: Path, cfg: DictConfig, result: Mapping[str, Any], metric: str) -> None:
    """A language-model run's report: ``result``, its model scored on eval.split, and the
    curves of its losses, its validation ``metric`` (bpb or accuracy) and its memory size
    against updates."""
    records = read_metrics(run_dir / METRICS_FILE)
    curves = plot_curves([(cfg.memory.kind, records)], lm_panels(f"valid_{metric}"), "updates")
    save_report(run_dir, result, curves)


def save_report(run_dir: Path, result: Mapping[str, Any], curves: Figure) -> None:
    """RUN_DIR/eval.json and RUN_DIR/curves.png, each written atomically."""
    with atomic_open(run_dir / EVAL_FILE, "w") as file:
        json.dump(result, file)
    with atomic_open(run_dir / CURVES_FILE, "wb") as file:
        curves.savefig(file, format="png", dpi=110)
