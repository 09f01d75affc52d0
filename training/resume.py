"""Resuming a run: which checkpoint a command continues (`resume`), the config it continues
with (the saved run's, but for the RESUMABLE fields the command gives), and the checks that
refuse a command before it writes anything into a run directory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from training.checkpoint import BEST_CHECKPOINT_FILE, SNAPSHOT, load_checkpoint
from training.composition import composed_files, config_file
from training.config import ConfigError, check_writable
from training.metrics import METRICS_FILE, WANDB_ID_FILE
from training.run_dir import (
    CHECKPOINT_FILE,
    CONFIG_FILE,
    CURVES_FILE,
    EVAL_FILE,
    claim_run_dir,
    command_line_overrides,
    get_run_dir,
    refuse_claimed,
)

RESUME_AUTO = "auto"  # resume=auto: continue the run directory's checkpoint, or start anew
RESUME_CHOICES = (False, True, RESUME_AUTO)
# Config fields a resume may change, each only where its command gives it (`given_keys`); the
# saved run's config wins for every other field.
RESUMABLE = (
    "resume",
    "overwrite",
    "total_steps",
    "log_interval",
    "checkpoint_interval",
    "checkpoint_keep",
    "eval_interval",
    "eval",
    "device",
    "torch_threads",
    "wandb",
    "nonfinite",  # (a run stopped by a divergence may continue skipping such updates instead)
    "nonfinite_skips",
)
# Learner settings a resume may also change, per trainer config: what to lower or clip after a
# run diverged, and what a study continues a held run under. Each change is recorded in the
# run's config (CHANGES_KEY: step, key, from, to), so the run says what it ran when.
CHANGEABLE = {
    "rl": (
        "agent.lr",
        "agent.lr_schedule",
        "agent.max_grad_norm",
        "agent.entropy_coef",
        "agent.entropy_schedule",
        "agent.anchor_coef",
        "agent.anchor_from",
        "agent.anchor_follows",
        "agent.anchor_after",
        "agent.anchor_schedule",
        "agent.cut_uniform_coef",
        "agent.greedy_envs",
        "agent.held_aux_loss_coef",
        "agent.held_attended_span_coef",
    ),
    "lm": ("lr", "grad_clip"),
}
CHANGES_KEY = "changed_at_resume"
# Learner settings since removed, each with the value at which a run ran as this version runs
# it: a run saved at another value cannot be continued as it ran (docs/history.md says why each
# was removed).
RETIRED = {
    "rl": {"agent.anchor_step": 1.0, "agent.anchor_temperature": 1.0},
}


def resume_checkpoint(
    run_dir: str | os.PathLike,
    resume: bool | str,
    *,
    overwrite: bool = False,
    map_location: Any = "cpu",
) -> dict[str, Any] | None:
    """The checkpoint to continue from when `resume` is set (None otherwise).

    With resume=true a run directory without a checkpoint is a config error: the user asked to
    resume a run that never saved one, or pointed hydra.run.dir at the wrong place. So is a new
    run in a directory that already holds one, unless `overwrite` says to delete that run
    first. resume=auto continues the directory's checkpoint if it has one and otherwise starts
    the run from step 0, deleting the files of a run that never saved one (a resume drops its
    lines after the checkpoint, here all of them): a stopped sweep restarts with the same
    command.
    """
    if resume and overwrite:
        raise ConfigError(
            f"resume={resume} continues the run that overwrite=true would delete: pick one"
        )
    if resume == RESUME_AUTO:
        checkpoint = load_checkpoint(run_dir, map_location=map_location)
        if checkpoint is None:
            delete_run(run_dir)
        return checkpoint
    if not resume:
        if overwrite:
            delete_run(run_dir)
        refuse_existing_run(run_dir)
        return None
    checkpoint = load_checkpoint(run_dir, map_location=map_location)
    if checkpoint is None:
        raise ConfigError(
            f"resume=true but there is no {CHECKPOINT_FILE} in {Path(run_dir).resolve()}; "
            "point hydra.run.dir at the directory of the run to resume, start a new run "
            "without resume=true, or take either with resume=auto"
        )
    return checkpoint


def delete_run(run_dir: str | os.PathLike) -> None:
    """Deletes what the run in `run_dir` wrote (overwrite=true): checkpoints, metrics, config,
    evaluation, curves, W&B files, and the lines of its log."""
    if not Path(run_dir).is_dir():
        return
    names = (CHECKPOINT_FILE, BEST_CHECKPOINT_FILE, METRICS_FILE, CONFIG_FILE, EVAL_FILE)
    for path in Path(run_dir).iterdir():
        if path.name in (*names, CURVES_FILE, WANDB_ID_FILE) or SNAPSHOT.fullmatch(path.name):
            path.unlink()
        elif path.name == "wandb" and path.is_dir():  # W&B's own directory, under dir=RUN_DIR
            shutil.rmtree(path)
        elif path.suffix == ".log":  # Hydra's job log, open for the new run's lines (append)
            os.truncate(path, 0)


def refuse_existing_run(run_dir: str | os.PathLike) -> None:
    """A new run must not overwrite the checkpoint and metrics of one already in `run_dir`."""
    written = [name for name in (CHECKPOINT_FILE, METRICS_FILE) if (Path(run_dir) / name).exists()]
    if written:
        raise ConfigError(
            f"{Path(run_dir).resolve()} already holds a run ({', '.join(written)}): continue "
            "it with resume=true, replace it with overwrite=true, or start the new run in "
            "another hydra.run.dir"
        )


def check_run_dir_argument(
    args: list[str], config_dir: Path, config_name: str, check: Callable[[DictConfig], None]
) -> None:
    """Checks a `hydra.run.dir=PATH` command line before Hydra starts, which creates the
    directory and writes `.hydra/` into it before the trainer runs: a directory that cannot be
    created or written, a new run aimed at an existing one, or a resume that would change the
    saved run's settings (`resumed_config`) or that `check` (the trainer's config check)
    rejects is a config error there and then, with nothing written. `config_dir` and
    `config_name` are the trainer's Hydra config."""
    given = [arg.split("=", 1)[1] for arg in args if arg.startswith("hydra.run.dir=")]
    if not given or "${" in given[-1] or any(arg.startswith("-") for arg in args):
        return  # Hydra's own directories, and multiruns, are Hydra's to check
    if "mode=eval" in args:
        return  # evaluation writes nothing into its directory (eval_writes_nothing)
    run_dir = Path(given[-1]).expanduser().absolute()
    refuse_claimed(run_dir)
    check_writable("hydra.run.dir", run_dir, directory=True)
    overrides = [arg for arg in args if not arg.startswith("hydra.")]
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        try:  # resume and overwrite may come from a config file (+sweep=suite: resume=auto)
            cfg = compose(config_name, overrides=overrides)
        except (HydraException, OmegaConfBaseException):
            return  # a malformed command line: Hydra reports it
        check_resume_of(cfg, run_dir, overrides, config_name, check)


def check_resume_of(
    cfg: DictConfig,
    run_dir: Path,
    overrides: list[str],
    config_name: str,
    check: Callable[[DictConfig], None],
) -> None:
    """`check_run_dir_argument`'s checks of the composed `cfg` (Hydra initialised)."""
    resume = cfg.get("resume", False)
    check_resume_choice(resume)
    if resume == RESUME_AUTO and not (run_dir / CHECKPOINT_FILE).exists():
        return  # a new run: the trainer deletes what a run that saved no checkpoint wrote
    if not resume:
        if not cfg.get("overwrite", False):
            refuse_existing_run(run_dir)
        return
    checkpoint = resume_checkpoint(run_dir, resume=True)
    resumed = resumed_config(cfg, checkpoint, overrides, config_name)
    check_resumed_budget(resumed, checkpoint)
    check(resumed)


def resumed_config(
    cfg: DictConfig, checkpoint: Mapping, overrides: list[str], config_name: str
) -> DictConfig:
    """The config of the run `checkpoint` continues: the saved one, with the RESUMABLE fields
    that this command sets explicitly (`given_keys`: on the command line, or in a file it adds
    such as `+sweep=suite`), taken from `cfg`; the rest keep the run's values, so a resume
    without `log_interval=...` logs at the run's own interval. The trainer's CHANGEABLE
    learner settings may be given too: each one that differs is appended to the config's
    CHANGES_KEY list as {step, key, from, to}, the step being the checkpoint's. A command-line
    override (Hydra's `key=value` strings) that would change any other field is a config error
    naming each leaf key it changes (a group override such as `memory=transformer_xl` changes
    the group's keys; a whole group would not say which), since the run cannot switch settings
    midway. A setting added to the trainer after the run began takes this command's value; one
    since removed (RETIRED) must have the value this version runs as. `config_name`: the
    trainer's Hydra config, initialised."""
    saved = OmegaConf.create(checkpoint["config"])
    for key, neutral in RETIRED.get(config_name, {}).items():
        value = OmegaConf.select(saved, key, default=neutral)
        if value != neutral:
            raise ConfigError(
                f"the run was saved with {key}={value}, a setting this version no longer has "
                f"(it runs as {key}={neutral}): continue the run with the version that made "
                "it, or start a new run in another hydra.run.dir"
            )

    unset = object()  # a key one of the two configs lacks (another task's options)

    def changes(key: str, now: Any, before: Any) -> list[str]:
        """`key=now (the run has before)` for each leaf under `key` whose value differs."""
        if isinstance(now, dict) and isinstance(before, dict):
            return [
                change
                for name in {**before, **now}  # the run's keys in order, then new ones
                for change in changes(
                    f"{key}.{name}", now.get(name, unset), before.get(name, unset)
                )
            ]
        if now == before:
            return []
        given = f"{key} unset" if now is unset else f"{key}={as_given(now)}"
        return [f"{given} (the run has {'none' if before is unset else as_given(before)})"]

    def as_given(value: Any) -> str:  # as written on a command line: null, not None
        return "null" if value is None else str(value)

    changeable = CHANGEABLE.get(config_name, ())
    conflicts: dict[str, None] = {}  # in order, once each (two overrides may reach one key)
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.split(".")[0] in RESUMABLE or key in changeable:
            continue
        now, before = _plain(OmegaConf.select(cfg, key)), _plain(OmegaConf.select(saved, key))
        conflicts.update(dict.fromkeys(changes(key, now, before)))
    if conflicts:
        shown = list(conflicts)[:4]  # enough to see what changed
        if len(conflicts) > 4:
            shown.append(f"... ({len(conflicts) - 4} more)")
        raise ConfigError(
            f"resume=true continues the saved run, but {'; '.join(shown)}: drop "
            f"{'this override' if len(conflicts) == 1 else 'these overrides'}, or start a "
            "new run in another hydra.run.dir"
        )
    for key in ("resume", "overwrite"):  # this command's own
        saved[key] = cfg.get(key)
    add_missing(saved, cfg)  # settings added to the trainer since the run began
    changes = list(saved.get(CHANGES_KEY) or [])
    for key in given_keys(overrides, config_name):
        value = OmegaConf.select(cfg, key, default=unset)
        before = OmegaConf.select(saved, key, default=None)
        if key in changeable and value is not unset and value != before:
            changes.append({"step": checkpoint["step"], "key": key, "from": before, "to": value})
        if (key.split(".")[0] in RESUMABLE or key in changeable) and value is not unset:
            OmegaConf.update(saved, key, value, force_add=True)
    if changes:
        saved[CHANGES_KEY] = changes
    return saved


def add_missing(saved: DictConfig, now: DictConfig) -> None:
    """Adds to ``saved``, at any depth, the keys of ``now`` it lacks (a setting added to the
    trainer after the run began, such as a new `eval.*` or `agent.*` key), with their values
    in ``now``; not into a group of which ``now`` holds another choice (its `name` or `kind`
    differs: a Portal run resumed by a command that composes the Corridor)."""
    for key in now.keys():
        if key not in saved:
            saved[key] = now[key]
        elif OmegaConf.is_dict(saved[key]) and OmegaConf.is_dict(now[key]):
            choice = ("name", "kind")
            if all(saved[key].get(k) == now[key].get(k) for k in choice):
                add_missing(saved[key], now[key])


def given_keys(overrides: Sequence[str], config_name: str) -> list[str]:
    """The dotted keys a command line sets: each override's key, or for an override that adds
    a config file (`+sweep=suite`, `+benchmark=...`) the keys that file sets, read as the
    start-up line reads them (`training.composition`). Needs Hydra initialised."""
    packages = dict(composed_files(config_name, overrides))  # config path -> its package
    keys = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        path = f"{key}/{value}"
        if path in packages:
            keys += config_file(path, packages[path]).settings
        else:
            keys.append(key)
    return keys


def check_resume_choice(resume: Any) -> None:
    """resume is one of RESUME_CHOICES: false, true or auto."""
    if resume not in RESUME_CHOICES:
        raise ConfigError(
            f"resume={resume} is not a choice: resume=false starts a new run, resume=true "
            "continues the run directory's checkpoint, resume=auto continues it if there is one"
        )


def resumed_run(cfg: DictConfig) -> tuple[DictConfig, dict[str, Any] | None]:
    """The config to train with and the checkpoint to continue from (None for a new run):
    with resume=true, the run directory's checkpoint and its run's config (`resumed_config`).
    Called inside the trainer's Hydra main, before the config is checked, so that a resumed
    run is checked as it will run."""
    check_resume_choice(cfg.resume)
    overwrite = bool(cfg.get("overwrite", False))
    claim_run_dir(get_run_dir())  # before anything in it is read, deleted or written
    checkpoint = resume_checkpoint(get_run_dir(), cfg.resume, overwrite=overwrite)
    if checkpoint is None:
        return cfg, None
    config_name = HydraConfig.get().job.config_name
    resumed = resumed_config(cfg, checkpoint, command_line_overrides(), config_name)
    check_resumed_budget(resumed, checkpoint)
    return resumed, checkpoint


def check_resumed_budget(resumed: DictConfig, checkpoint: Mapping) -> None:
    """A resume may change total_steps only where the learning rate does not follow it: an
    annealed rate (RL's agent.lr_schedule=linear, the LM's cosine decay to min_lr_ratio < 1)
    took the run's first budget into every step so far, so no other budget continues it
    exactly. ``resumed``: the config the run continues with (`resumed_config`), whose rate
    schedule may be one the resume changed to."""
    total_steps, before = resumed.total_steps, checkpoint["config"]["total_steps"]
    if "agent" in resumed:
        annealed = resumed.agent.get("lr_schedule") == "linear"
        fix = "agent.lr_schedule=constant"
    else:
        annealed, fix = resumed.get("min_lr_ratio", 1) != 1, "min_lr_ratio=1"
    if total_steps == before or not annealed:
        return
    raise ConfigError(
        f"total_steps={total_steps}: this run anneals its learning rate over the total_steps it "
        f"started with ({before}), so it continues exactly only with total_steps={before} "
        f"(start runs to be extended with {fix})"
    )


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
