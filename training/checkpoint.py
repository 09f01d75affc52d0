"""Atomic checkpoints in the run directory, and finding them again on resume.

`RUN_DIR/checkpoint.pt` is always the latest complete checkpoint: it is written to a
temporary file, fsynced and renamed over the old one, so a run killed while saving still
has its previous checkpoint. `keep_last=k` also keeps hard-linked copies of the k latest
checkpoints as `checkpoint_<step>.pt` (no extra disk space for the newest one).

Checkpoints hold tensors and plain Python values only (state dicts of modules and
optimizers, numbers, strings, lists, dicts; see `training.seeding.rng_state`), so they
load with `torch.load(weights_only=True)`. `save_checkpoint` checks this up front, and adds
"sha256", a digest of the contents that `load_checkpoint` checks: a file whose bytes changed
after it was written (a disk or copy error) is refused rather than loaded.
"""

from __future__ import annotations

import collections
import hashlib
import io
import os
import pickle
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from training.config import ConfigError, check_writable
from training.files import atomic_open, remove_orphans, reporting_disk_full
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

DIGEST_KEY = "sha256"  # the checkpoint's digest of the rest of its contents (content_digest)
BEST_CHECKPOINT_FILE = "best.pt"  # the model at the best logged task metric (for evaluation)
_SNAPSHOT = re.compile(r"checkpoint_(\d+)\.pt")
RESUME_AUTO = "auto"  # resume=auto: continue the run directory's checkpoint, or start anew
RESUME_CHOICES = (False, True, RESUME_AUTO)
# Config fields a resumed run takes from the command line; the saved run's config wins for
# every other field.
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
)
# What torch.load(weights_only=True) reads back; exact types, so e.g. numpy.float64 (a float
# subclass that pickles as a NumPy object) is caught.
_PLAIN_TYPES = (int, float, complex, bool, str, bytes, bytearray, type(None))
_TORCH_TYPES = (torch.Tensor, torch.Size, torch.dtype, torch.device)
_MAPPING_TYPES = (dict, collections.OrderedDict)
_SEQUENCE_TYPES = (list, tuple, set)


def save_checkpoint(
    run_dir: str | os.PathLike,
    state: Mapping[str, Any],
    *,
    keep_last: int = 0,
    filename: str = CHECKPOINT_FILE,
) -> Path:
    """Atomically write `state` (which holds the integer "step") to RUN_DIR/checkpoint.pt, or
    RUN_DIR/`filename` (e.g. BEST_CHECKPOINT_FILE).

    Call it on the main rank only (DDP keeps the model identical on every rank). Returns
    the checkpoint's path.
    """
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise ValueError(f'a checkpoint needs an integer "step" in its state, got {step!r}')
    if keep_last < 0:
        raise ValueError(f"keep_last={keep_last} must be >= 0")
    state = dict(state)
    _check_loadable(state, "state")
    state[DIGEST_KEY] = content_digest(state)
    run_dir = Path(run_dir)
    path = run_dir / filename
    contents = io.BytesIO()  # serialised first, so a full disk fails in our own write
    torch.save(state, contents)
    latest = run_dir / CHECKPOINT_FILE  # what a resume reads, whichever file is written
    intact = (
        f"{latest}, the last complete checkpoint, is intact: free space, then resume=true"
        if latest.exists()
        else "no checkpoint of this run was complete yet"
    )
    with reporting_disk_full(path, intact), atomic_open(path, "wb") as file:
        file.write(contents.getbuffer())
    if keep_last:
        remove_orphans(run_dir, "checkpoint_*.pt")  # snapshots are written once, by name
        _snapshot(path, run_dir / f"checkpoint_{step}.pt")
        for _, old in kept_checkpoints(run_dir)[:-keep_last]:
            old.unlink(missing_ok=True)
    return path


def kept_checkpoints(run_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """The run's ``checkpoint_<step>.pt`` snapshots (``checkpoint_keep``), oldest first."""
    return sorted(
        (int(match.group(1)), candidate)
        for candidate in Path(run_dir).iterdir()
        if (match := _SNAPSHOT.fullmatch(candidate.name))
    )


def checkpoint_file(path: str | os.PathLike) -> Path:
    """The checkpoint file a path names: the file itself, or RUN_DIR/checkpoint.pt."""
    path = Path(path)
    return path / CHECKPOINT_FILE if path.is_dir() else path


def load_checkpoint(path: str | os.PathLike, *, map_location: Any = "cpu") -> dict[str, Any] | None:
    """Load a checkpoint file, or RUN_DIR/checkpoint.pt when given a directory; None if absent,
    a ConfigError if it cannot be read."""
    path = checkpoint_file(path)
    if not path.is_file():
        return None
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except (KeyError, RuntimeError, EOFError, pickle.UnpicklingError) as error:
        raise ConfigError(
            f"{path} cannot be read as a checkpoint ({type(error).__name__}): it is truncated, "
            f"or not a checkpoint file{_older_snapshot(path)}"
        ) from None
    digest = checkpoint.pop(DIGEST_KEY, None) if isinstance(checkpoint, dict) else None
    if digest != content_digest(checkpoint):
        problem = "has no digest" if digest is None else "does not match its digest"
        raise ConfigError(
            f"{path} {problem}: its contents are not what was saved (a disk or copy error, or "
            f"not this project's checkpoint){_older_snapshot(path)}"
        )
    return checkpoint


def _older_snapshot(path: Path) -> str:
    """Where to resume from instead of a damaged `path`: its run's newest kept snapshot, if
    checkpoint_keep kept one (said as a clause of an error message)."""
    if path.name != CHECKPOINT_FILE:
        return ""
    kept = [snapshot for _, snapshot in kept_checkpoints(path.parent) if snapshot != path]
    if not kept:
        return ""
    return f"; the newest kept snapshot is {kept[-1]}: copy it over {path} to resume from it"


def content_digest(value: Any) -> str:
    """A SHA-256 of a checkpoint's contents: every key, plain value and tensor (dtype, shape
    and bytes), in order; what the file's bytes decode to, not the bytes themselves."""
    digest = hashlib.sha256()
    _feed(digest, value)
    return digest.hexdigest()


def _feed(digest: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"tensor {tensor.dtype} {tuple(value.shape)};".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, Mapping):
        digest.update(f"{{{len(value)};".encode())
        for key, item in value.items():
            _feed(digest, key)
            _feed(digest, item)
    elif isinstance(value, list | tuple | set):
        items = sorted(value, key=repr) if isinstance(value, set) else value
        digest.update(f"{type(value).__name__}[{len(value)};".encode())
        for item in items:
            _feed(digest, item)
    else:
        digest.update(f"{type(value).__name__}:{value!r};".encode())


def check_checkpoint_kind(checkpoint: Mapping[str, Any], key: str, path: Any, other: str) -> None:
    """A checkpoint must hold `key` ("agent" for train_rl.py, "model" for train_lm.py); one
    from the `other` trainer is a config error that says where it belongs."""
    if key not in checkpoint:
        raise ConfigError(
            f"checkpoint={path} holds no {key!r}: it is not this trainer's (use {other} for it)"
        )


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
        if path.name in (*names, CURVES_FILE, WANDB_ID_FILE) or _SNAPSHOT.fullmatch(path.name):
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
    try:  # resume and overwrite may come from a config file (+sweep=suite sets resume=auto)
        with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
            cfg = compose(config_name, overrides=overrides)
    except (HydraException, OmegaConfBaseException):
        return  # a malformed command line: Hydra reports it
    resume = cfg.get("resume", False)
    check_resume_choice(resume)
    if resume == RESUME_AUTO and not (run_dir / CHECKPOINT_FILE).exists():
        return  # a new run: the trainer deletes what a run that saved no checkpoint wrote
    if not resume:
        if not cfg.get("overwrite", False):
            refuse_existing_run(run_dir)
        return
    checkpoint = resume_checkpoint(run_dir, resume=True)
    check_resumed_budget(cfg.total_steps, checkpoint)
    check(resumed_config(cfg, checkpoint, overrides, config_dir))


def resumed_config(
    cfg: DictConfig, checkpoint: Mapping, overrides: list[str], config_dir: Path | None = None
) -> DictConfig:
    """The config of the run `checkpoint` continues: the saved one, with the RESUMABLE fields
    that this command sets explicitly (`given_keys`: on the command line, or in a file it adds
    such as `+sweep=suite`), taken from `cfg`; the rest keep the run's values, so a resume
    without `log_interval=...` logs at the run's own interval. A command-line override
    (Hydra's `key=value` strings) that would change any other field is a config error naming
    each leaf key it changes (a group override such as `memory=transformer_xl` changes the
    group's keys; a whole group would not say which), since the run cannot switch settings
    midway. `config_dir`: the trainer's configs, where the files an override adds are."""
    saved = OmegaConf.create(checkpoint["config"])

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

    conflicts: dict[str, None] = {}  # in order, once each (two overrides may reach one key)
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        if key.split(".")[0] in RESUMABLE:
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
    for key in given_keys(overrides, config_dir):
        if key.split(".")[0] in RESUMABLE and OmegaConf.select(cfg, key) is not None:
            OmegaConf.update(saved, key, OmegaConf.select(cfg, key), force_add=True)
    return saved


def given_keys(overrides: Sequence[str], config_dir: Path | None) -> list[str]:
    """The dotted keys a command line sets: each override's key, or for an override that adds
    a file of `config_dir` (`+sweep=suite`, `+benchmark=...`) the keys that file sets."""
    keys = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        path = config_dir / key / f"{value}.yaml" if config_dir is not None else None
        if path is None or not path.is_file():
            keys.append(key)
            continue
        text = path.read_text()
        package = "" if "@package _global_" in text.split("\n", 1)[0] else f"{key}."
        node = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
        keys += [f"{package}{name}" for name in _leaf_keys(node) if name.split(".")[0] != "hydra"]
    return keys


def _leaf_keys(node: Any, prefix: str = "") -> list[str]:
    """The dotted keys of a config file's leaves (its `defaults` list is not a setting)."""
    if not isinstance(node, dict):
        return [prefix[:-1]]
    return [
        leaf
        for name, value in node.items()
        if f"{prefix}{name}" != "defaults"
        for leaf in _leaf_keys(value, f"{prefix}{name}.")
    ]


def check_resume_choice(resume: Any) -> None:
    """resume is one of RESUME_CHOICES: false, true or auto."""
    if resume not in RESUME_CHOICES:
        raise ConfigError(
            f"resume={resume} is not a choice: resume=false starts a new run, resume=true "
            "continues the run directory's checkpoint, resume=auto continues it if there is one"
        )


def resumed_run(cfg: DictConfig, config_dir: Path) -> tuple[DictConfig, dict[str, Any] | None]:
    """The config to train with and the checkpoint to continue from (None for a new run):
    with resume=true, the run directory's checkpoint and its run's config (`resumed_config`;
    `config_dir`: the trainer's configs). Called before the config is checked, so that a
    resumed run is checked as it will run."""
    check_resume_choice(cfg.resume)
    overwrite = bool(cfg.get("overwrite", False))
    claim_run_dir(get_run_dir())  # before anything in it is read, deleted or written
    checkpoint = resume_checkpoint(get_run_dir(), cfg.resume, overwrite=overwrite)
    if checkpoint is None:
        return cfg, None
    check_resumed_budget(cfg.total_steps, checkpoint)
    return resumed_config(cfg, checkpoint, command_line_overrides(), config_dir), checkpoint


def check_resumed_budget(total_steps: int, checkpoint: Mapping) -> None:
    """A resume may change total_steps only where the learning rate does not follow it: an
    annealed rate (RL's agent.lr_schedule=linear, the LM's cosine decay to min_lr_ratio < 1)
    took the run's first budget into every step so far, so no other budget continues it
    exactly."""
    saved = checkpoint["config"]
    before = saved["total_steps"]
    if "agent" in saved:
        annealed, fix = saved["agent"].get("lr_schedule") == "linear", "agent.lr_schedule=constant"
    else:
        annealed, fix = saved.get("min_lr_ratio", 1) != 1, "min_lr_ratio=1"
    if total_steps == before or not annealed:
        return
    raise ConfigError(
        f"total_steps={total_steps}: this run anneals its learning rate over the total_steps it "
        f"started with ({before}), so it continues exactly only with total_steps={before} "
        f"(start runs to be extended with {fix})"
    )


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _snapshot(latest: Path, snapshot: Path) -> None:
    """Make `snapshot` a copy of `latest` (a hard link where the file system allows one)."""
    tmp = snapshot.with_name(f".{snapshot.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(latest, tmp)
    except OSError:
        shutil.copyfile(latest, tmp)
    os.replace(tmp, snapshot)


def _check_loadable(value: Any, where: str) -> None:
    """Reject objects that `torch.load(weights_only=True)` would refuse, naming where they are."""
    if type(value) in _PLAIN_TYPES or isinstance(value, _TORCH_TYPES):
        return
    if type(value) in _MAPPING_TYPES:
        for key, item in value.items():
            _check_loadable(key, f"{where} key {key!r}")
            _check_loadable(item, f"{where}[{key!r}]")
        return
    if type(value) in _SEQUENCE_TYPES:
        for index, item in enumerate(value):
            _check_loadable(item, f"{where}[{index}]")
        return
    raise TypeError(
        f"{where} has type {type(value).__module__}.{type(value).__qualname__}; checkpoints hold "
        "tensors and plain Python values only (convert arrays with torch.as_tensor, numbers "
        "with float/int, configs with OmegaConf.to_container)"
    )
