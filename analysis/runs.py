"""Which trainer wrote a run. Each analysis tool reads the runs of one trainer (`plot` reads
both), and refuses a run of the other in one line, before any work, rather than failing deep
inside on a config key that only the other trainer writes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lm.tasks import task_options
from training.checkpoint import load_checkpoint
from training.config import CONFIG_ERROR_EXIT_CODE
from training.run_dir import CONFIG_FILE


@dataclass(frozen=True)
class RunKind:
    """The runs of one trainer, told apart by the config group only that trainer has."""

    noun: str  # "an RL run"
    plural: str  # "RL runs"
    trainer: str
    key: str  # its config group (`env` or `task`), whose `name` says which env or task
    tools: str  # the analysis tools that read such runs, for the message that refuses one
    config_name: str  # its top config file, configs/<config_name>.yaml


RL = RunKind(
    "an RL run",
    "RL runs",
    "train_rl.py",
    "env",
    "analysis.curves, analysis.span_drift or analysis.plot",
    "rl",
)
LM = RunKind(
    "a language-model run",
    "language-model runs",
    "train_lm.py",
    "task",
    "analysis.visualize, analysis.collision_probe or analysis.plot",
    "lm",
)
KINDS = (RL, LM)


class RunKindError(Exception):
    """A tool was given a run it does not read; the message says what it is and what reads it."""


def run_kind(config: Mapping[str, Any]) -> RunKind | None:
    """The kind of run a config (a run's config.yaml, a checkpoint's "config") is from; None
    for a config of neither trainer."""
    return next((kind for kind in KINDS if kind.key in config), None)


def saved_config(run_dir: str | os.PathLike) -> DictConfig | None:
    """RUN_DIR/config.yaml, which both trainers write first thing; None where there is none."""
    path = Path(run_dir) / CONFIG_FILE
    return OmegaConf.load(path) if path.is_file() else None


def check_run_kind(path: str | os.PathLike, config: Mapping[str, Any], needed: RunKind) -> None:
    """RunKindError unless `config`, that of the run or checkpoint at `path`, is a `needed` run."""
    found = run_kind(config)
    if found is needed:
        return
    wanted = f"this tool reads {needed.plural} of {needed.trainer}"
    if found is None:
        raise RunKindError(
            f"{path} is not a run of {RL.trainer} or {LM.trainer} (its config has neither "
            f"{RL.key} nor {LM.key}); {wanted}"
        )
    group = config[found.key]
    name = group.get("name", "?") if isinstance(group, Mapping) else "?"
    what = f"a checkpoint of {found.noun}" if Path(path).is_file() else found.noun
    raise RunKindError(
        f"{path} is {what} of {found.trainer} ({found.key}={name}); {wanted} "
        f"(for {found.plural} use {found.tools})"
    )


def require_run_kind(
    prog: str, path: str | os.PathLike, config: Mapping[str, Any], needed: RunKind
) -> None:
    """`check_run_kind` for a command's input: a run of the other kind ends the command with
    one line on stderr and exit code 2, as the trainers' config errors do."""
    try:
        check_run_kind(path, config, needed)
    except RunKindError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        sys.exit(CONFIG_ERROR_EXIT_CODE)


def task_model(
    parser: argparse.ArgumentParser, path: str, task: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A probe's input: the checkpoint of a language model of `task` (a file or run directory)
    and that task's options (its defaults, then the run's). No checkpoint, an RL run or a
    model of another task ends the command with one line."""
    checkpoint = load_checkpoint(path)
    if checkpoint is None:
        parser.error(f"{path}: no checkpoint file there")
    require_run_kind(parser.prog, path, checkpoint.get("config", {}), LM)
    options = dict(checkpoint["config"]["task"])
    if options.pop("name") != task:
        parser.error(f"{path} is not a model of the {task} task")
    return checkpoint, task_options(task) | options
