"""Config validation: bad values fail at start-up with a message that says how to fix them.

Hydra itself rejects unknown config-group options (`env=corridr`) and unknown keys before
the app runs, listing the available options. These helpers cover what Hydra cannot see:
values of plain keys (`memory.kind=xl`, `lr=-1`, `wandb.mode=onlin`).
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import sys
from collections.abc import Callable, Iterable
from numbers import Real
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

CONFIG_ERROR_EXIT_CODE = 2
# torch.compile's modes a training step may be compiled in (compile_learner, compile_step)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")

F = TypeVar("F", bound=Callable[..., Any])


class RunError(Exception):
    """An error the user can act on; an entry point prints it as one line (exit_on_config_error)
    starting with its `kind`."""

    kind = "Error"
    exit_code = CONFIG_ERROR_EXIT_CODE


class ConfigError(RunError):
    """A config value is wrong; the message names the key, the value and what would be right."""

    kind = "Config error"


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """Fail unless `value` is one of `choices`."""
    choices = list(choices)
    if value in choices:
        return
    noun = name.rsplit(".", 1)[-1]
    message = f"{name}={value} is not a known {noun}; choose one of: {', '.join(map(str, choices))}"
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    if close:
        message += f" (did you mean {close[0]}?)"
    raise ConfigError(message)


def refuse_added_keys(
    overrides: Iterable[str], cfg: Any, config_dir: Path, open_keys: Iterable[str] = ()
) -> None:
    """Hydra's `+KEY=VALUE` adds a key the config lacks, which nothing reads: a misspelt
    setting (`+agent.lrr=1`) would train without it. Refuse it, but for config groups
    (`+sweep=suite`) and keys under ``open_keys``, mappings whose keys are free (a Gymnasium
    env's keyword arguments)."""
    open_keys = tuple(open_keys)
    for override in overrides:
        if not override.startswith("+") or override.startswith("++") or "=" not in override:
            continue
        key = override[1:].split("=", 1)[0]
        parent, _, name = key.rpartition(".")
        if (config_dir / key.replace(".", "/")).is_dir() or key.startswith("hydra."):
            continue
        if parent in open_keys:
            continue
        node = OmegaConf.select(cfg, parent) if parent else cfg
        known = [str(k) for k in node if k != name] if OmegaConf.is_dict(node) else []
        close = difflib.get_close_matches(name, known, n=1)
        hint = f"did you mean {key[: -len(name)]}{close[0]}?" if close else "check its spelling"
        raise ConfigError(
            f"+{key}: {parent or 'the config'} has no setting {name}, and nothing reads a key "
            f"that + adds; {hint}"
        )


def check_positive(name: str, value: Any) -> None:
    """Fail unless `value` is a number > 0."""
    check_range(name, value, low=0, low_open=True)


def check_positive_int(name: str, value: Any) -> None:
    """Fail unless `value` is an integer > 0 (counts: steps, layers, environments)."""
    if not _is_whole(value):
        raise ConfigError(f"{name}={value} must be a whole number > 0")
    check_range(name, value, low=1)


def check_whole(name: str, value: Any, low: int = 0) -> None:
    """Fail unless `value` is an integer >= `low` (counts that may be 0)."""
    if not _is_whole(value):
        raise ConfigError(f"{name}={value} must be a whole number >= {low}")
    check_range(name, value, low=low)


def check_writable(name: str, path: str | os.PathLike, *, directory: bool = False) -> None:
    """Fail unless `path`, a file (or with `directory`, a directory), can be created or written
    there: a writable file it replaces, or else the nearest part of it that exists is a writable
    directory. Checked before the work whose result it will hold."""
    path = Path(path).expanduser().absolute()
    if path.is_dir() and not directory:
        raise ConfigError(f"{name}={path} is a directory; give a file name")
    if path.is_file() and not directory:
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{name}={path} is a file that cannot be written; choose another")
        return
    existing = next(part for part in (path, *path.parents) if part.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        problem = "not a directory" if not existing.is_dir() else "not writable"
        raise ConfigError(
            f"{name}={path} cannot be created or written ({existing} is {problem}); "
            "choose another place"
        )


def _is_whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_range(
    name: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
) -> None:
    """Fail unless `value` is a number between `low` and `high` (None: unbounded).

    Bounds are included unless `low_open` / `high_open` say otherwise; NaN is never in range.
    """
    bounds = _describe_range(low, high, low_open, high_open)
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise ConfigError(f"{name}={value} must be a number {bounds}".rstrip())
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise ConfigError(f"{name}={value} must be {bounds}")


def _describe_range(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return ""
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def exit_on_config_error(main: F) -> F:
    """Decorate an entry point so a ConfigError (any RunError) prints one line to stderr and
    exits with its code (2; 3 for a divergence, `training.divergence`).

    Put it under `@hydra.main` and validate the config first thing in `main`, so a bad value
    stops the run before any work is done. Under `-m` the sweep stops at the first bad job.
    """

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return main(*args, **kwargs)
        except RunError as error:
            from training.run_dir import discard_unused_run_dir  # (run_dir imports this module)

            discard_unused_run_dir()
            print(f"{error.kind}: {error}", file=sys.stderr)
            sys.exit(error.exit_code)

    return wrapper  # type: ignore[return-value]
