"""Atomic checkpoints in the run directory (what resuming does with them: `training.resume`).

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.config import ConfigError
from training.files import atomic_open, remove_orphans, reporting_disk_full
from training.run_dir import CHECKPOINT_FILE

DIGEST_KEY = "sha256"  # the checkpoint's digest of the rest of its contents (content_digest)
BEST_CHECKPOINT_FILE = "best.pt"  # the model at the best logged task metric (for evaluation)
SNAPSHOT = re.compile(r"checkpoint_(\d+)\.pt")
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
        if (match := SNAPSHOT.fullmatch(candidate.name))
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


def load_trained(path: str | os.PathLike, key: str, other: str) -> dict[str, Any]:
    """The checkpoint that mode=eval evaluates (a file, or RUN_DIR/checkpoint.pt), which must
    hold `key` (`check_checkpoint_kind`)."""
    checkpoint = load_checkpoint(path)
    if checkpoint is None:
        raise ConfigError(f"checkpoint={path}: no checkpoint file there")
    check_checkpoint_kind(checkpoint, key, path, other)
    return checkpoint


def check_checkpoint_kind(checkpoint: Mapping[str, Any], key: str, path: Any, other: str) -> None:
    """A checkpoint must hold `key` ("agent" for train_rl.py, "model" for train_lm.py); one
    from the `other` trainer is a config error that says where it belongs."""
    if key not in checkpoint:
        raise ConfigError(
            f"checkpoint={path} holds no {key!r}: it is not this trainer's (use {other} for it)"
        )


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
