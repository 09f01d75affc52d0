"""Language-model tasks: byte-level text (enwik8, any file) and the paper's memory tasks."""

from lm.data import (
    IGNORE,
    DataNotFoundError,
    Split,
    TaskData,
    TaskDataError,
    answer_accuracy,
    source_rows,
)
from lm.tasks import TASKS, load_task, task_options

__all__ = [
    "IGNORE",
    "TASKS",
    "DataNotFoundError",
    "Split",
    "TaskData",
    "TaskDataError",
    "answer_accuracy",
    "load_task",
    "source_rows",
    "task_options",
]
