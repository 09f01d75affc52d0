"""The command line of a trainer (train_rl.py, train_lm.py): what is checked before Hydra
starts, and what the trainer's Hydra main does: evaluate a checkpoint (mode=eval), or train a
new or resumed run."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

from omegaconf import DictConfig

from training.config import exit_on_config_error
from training.extras import require_launcher
from training.resume import check_run_dir_argument, resumed_run
from training.run_dir import eval_writes_nothing

Check = Callable[[DictConfig], None]


def checked_command_line(
    args: list[str], config_dir: Path, config_name: str, check_config: Check
) -> list[str]:
    """The command line Hydra is to run (mode=eval's writes nothing), checked before Hydra
    writes anything: the launcher it names is installed, and a `hydra.run.dir` it names holds
    a run this command may start, continue or replace. A bad one exits with one line."""
    args = eval_writes_nothing(args)
    exit_on_config_error(require_launcher)(args)
    exit_on_config_error(check_run_dir_argument)(args, config_dir, config_name, check_config)
    return args


def train_or_evaluate(
    cfg: DictConfig,
    check_config: Check,
    train: Callable[[DictConfig, dict | None], None],
    evaluate: Check,
) -> None:
    """mode=eval evaluates a checkpoint; otherwise a new run, or the run it resumes
    (`resumed_run`), is checked as it will run and trained."""
    if cfg.mode == "eval":
        check_config(cfg)
        evaluate(cfg)
        return
    cfg, checkpoint = resumed_run(cfg)
    check_config(cfg)
    train(cfg, checkpoint)
    gc.collect()  # frees a DDP wrapper's process group now, not at shutdown (cleanup_distributed)
