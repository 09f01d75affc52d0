"""The run directory: where a run's config, metrics and checkpoints live.

A run directory holds `config.yaml` (the resolved config), `metrics.jsonl` and
`checkpoint.pt`; sweep tools read the first two. Under Hydra it is the job's output
directory (for `-m` sweeps, SWEEP_DIR/<job number>); otherwise the working directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path
from typing import IO, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from training.config import ConfigError
from training.distributed import DistInfo, broadcast_object
from training.files import atomic_open

try:
    import fcntl
except ImportError:  # not POSIX: run directories are not claimed
    fcntl = None

CONFIG_FILE = "config.yaml"
CHECKPOINT_FILE = "checkpoint.pt"  # the latest complete checkpoint (training.checkpoint)
EVAL_FILE = "eval.json"  # a finished run's evaluation (eval.after_training)
CURVES_FILE = "curves.png"  # and its learning curves
CLAIM_FILE = ".run.lock"  # held (flock) by the process that owns the run directory
_claims: dict[Path, IO] = {}  # this process's claims, open for as long as it lives


def get_run_dir(dist: DistInfo | None = None) -> Path:
    """This run's directory; under torchrun every rank gets rank 0's.

    Each torchrun process starts its own Hydra app, and a timestamped Hydra run directory
    can differ by a second between ranks, so rank 0's choice is broadcast.
    """
    run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else os.getcwd()
    if dist is not None:
        run_dir = broadcast_object(str(run_dir), dist)
    return Path(run_dir)


def eval_writes_nothing(args: list[str]) -> list[str]:
    """The command line `args` with, for `mode=eval`, the Hydra settings that keep evaluation
    from writing a run directory of its own: its directory is the checkpoint's (or the one
    given), with no .hydra/ and no log file in it; evaluation prints its result."""
    if "mode=eval" not in args or any(arg.startswith("-") for arg in args):
        return args
    extra = ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    if not any(arg.startswith("hydra.run.dir=") for arg in args):
        given = [arg.split("=", 1)[1] for arg in args if arg.startswith("checkpoint=")]
        path = Path(given[-1] if given else ".").expanduser().absolute()
        existing = next(p for p in (path, *path.parents) if p.is_dir())
        escaped = str(existing).replace("\\", "\\\\").replace("'", "\\'")
        extra.append(f"hydra.run.dir='{escaped}'")
    return [*args, *extra]


HYDRA_FILES = (".hydra", CLAIM_FILE)  # and the job's log: what Hydra and the claim write first


def discard_unused_run_dir() -> None:
    """Remove this job's run directory if it holds nothing but what Hydra and the claim wrote
    before the run was refused (its .hydra/, its log, .run.lock): a refused command leaves no
    directory behind. A directory with anything else in it is left alone, and so is one that
    another live process claimed (a run in its first seconds, which refused this one)."""
    if not HydraConfig.initialized():
        return
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    log = f"{HydraConfig.get().job.name}.log"
    if not run_dir.is_dir() or any(p.name not in (*HYDRA_FILES, log) for p in run_dir.iterdir()):
        return
    claim = _claims.pop(run_dir.resolve(), None)
    if claim is None and fcntl is not None and (run_dir / CLAIM_FILE).exists():
        try:
            claim = _locked(run_dir)  # (held while the directory goes)
        except ConfigError:
            return
    shutil.rmtree(run_dir, ignore_errors=True)
    if claim is not None:
        claim.close()
    for parent in run_dir.resolve().parents:  # runs/rl/<env>-<memory>/, if Hydra made them
        if parent == Path.cwd() or Path.cwd() not in parent.parents or any(parent.iterdir()):
            break
        parent.rmdir()


def command_line_overrides() -> list[str]:
    """The `key=value` overrides the run was started with (none outside Hydra)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def save_resolved_config(run_dir: str | os.PathLike, cfg: Any) -> Path:
    """Write the config with every interpolation resolved to RUN_DIR/config.yaml, atomically."""
    path = Path(run_dir) / CONFIG_FILE
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    with atomic_open(path, "w") as file:
        file.write(OmegaConf.to_yaml(cfg, resolve=True))
    return path


def claim_run_dir(run_dir: str | os.PathLike) -> None:
    """Make `run_dir` this process's for as long as it lives: a second process, a new run or a
    resume, is refused with a config error naming the holder. The claim is an flock on
    RUN_DIR/.run.lock, which the system releases when its process ends, however it ends, so a
    killed run leaves nothing that blocks its resume. Under torchrun only rank 0 claims."""
    run_dir = Path(run_dir).resolve()
    if fcntl is None or run_dir in _claims or int(os.environ.get("RANK", 0)):
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    file = _locked(run_dir)
    file.seek(0)
    file.truncate()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    file.write(f"process {os.getpid()} on {socket.gethostname()} (since {started})\n")
    file.flush()
    _claims[run_dir] = file


def refuse_claimed(run_dir: str | os.PathLike) -> None:
    """A config error if a live process holds `run_dir` (claim_run_dir); claims nothing.
    Under torchrun only rank 0 checks: the others find the directory claimed by rank 0."""
    run_dir = Path(run_dir).resolve()
    checks = fcntl is not None and not int(os.environ.get("RANK", 0)) and run_dir not in _claims
    if checks and (run_dir / CLAIM_FILE).exists():
        _locked(run_dir).close()


def _locked(run_dir: Path) -> IO:
    """RUN_DIR/.run.lock, open and flocked by this process; a config error naming the holder
    if another process holds it."""
    file = open(run_dir / CLAIM_FILE, "a+")  # noqa: SIM115 (closed by the caller, or at exit)
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        file.seek(0)
        holder = file.read().strip() or "another process"
        file.close()
        raise ConfigError(
            f"{run_dir} is in use by {holder}: wait for that run to end, or give this one "
            "another hydra.run.dir"
        ) from None
    return file
