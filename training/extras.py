"""The optional parts of the project, each an extra of pyproject.toml, and the one-line error
that names the extra when a part is used without it."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable

from training.config import ConfigError

# module -> (the extra that installs it, what needs it)
EXTRAS = {
    "popgym": ("popgym", "POPGym's tasks (env=popgym)"),
    "imageio_ffmpeg": ("video", "an MP4 recording (eval.record=FILE.mp4)"),
    "hydra_plugins.hydra_joblib_launcher": ("sweeps", "a parallel sweep (hydra/launcher=joblib)"),
    "hydra_plugins.hydra_submitit_launcher": ("slurm", "a Slurm sweep (hydra/launcher=slurm)"),
}
LAUNCHERS = {  # hydra/launcher=NAME -> the module its plugin lives in
    "joblib": "hydra_plugins.hydra_joblib_launcher",
    "slurm": "hydra_plugins.hydra_submitit_launcher",
}


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require(module: str) -> None:
    """A config error naming the extra to install unless ``module`` (a key of EXTRAS) is
    importable."""
    if not installed(module):
        extra, needed_by = EXTRAS[module]
        raise ConfigError(
            f"{needed_by} needs {module.rsplit('.', 1)[-1]}, which is not installed: "
            f'pip install -e ".[{extra}]"'
        )


def require_launcher(args: Iterable[str]) -> None:
    """Checks, before Hydra starts, that the launcher a command line names is installed."""
    for arg in args:
        if arg.startswith("hydra/launcher="):
            module = LAUNCHERS.get(arg.split("=", 1)[1])
            if module is not None:
                require(module)
