"""Every language-model task by name, as the trainer's `task=...` config selects them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lm.collision import load_collision
from lm.copy_task import load_copy
from lm.data import TaskData, TaskDataError, load_enwik8, load_text
from lm.instruction import load_instruction

TASKS: dict[str, Callable[..., TaskData]] = {
    "enwik8": load_enwik8,
    "text": load_text,
    "collision": load_collision,
    "copy": load_copy,
    "instruction": load_instruction,
}


def task_options(name: str) -> dict[str, Any]:
    """The options a task takes and their defaults (inspect.Parameter.empty: required)."""
    if name not in TASKS:
        raise TaskDataError(f"unknown task {name!r}; choose one of {', '.join(TASKS)}")
    return {p.name: p.default for p in inspect.signature(TASKS[name]).parameters.values()}


def load_task(name: str, **options: Any) -> TaskData:
    """Load or generate task `name`, e.g. `load_task("copy", distance=256, cache_dir="cache")`."""
    unknown = sorted(set(options) - set(task_options(name)))
    if unknown:
        raise TaskDataError(
            f"task {name!r} has no option {', '.join(unknown)}; "
            f"its options are {', '.join(task_options(name))}"
        )
    return TASKS[name](**options)
