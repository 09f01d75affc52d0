"""A tqdm progress bar with steps/s and the key metrics, readable on a terminal and in a log.

On a terminal the bar redraws in place twice a second. When stderr is a file (a batch job,
`nohup`, a Hydra sweep's log) every redraw becomes its own line, printed at most every
LOG_INTERVAL_SECONDS, so the log shows the run's progress without carriage-return clutter.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import IO, Any

from tqdm import tqdm

TERMINAL_INTERVAL_SECONDS = 0.5
LOG_INTERVAL_SECONDS = 30.0
# tqdm drops "{desc}: " when there is no description.
_LOG_FORMAT = (
    "{desc}: {percentage:3.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)


class _OneLinePerUpdate:
    """A stream that turns tqdm's in-place redraws into separate lines."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self._stream.write(line + "\n")

    def flush(self) -> None:
        self._stream.flush()


def progress_bar(
    total: int,
    *,
    initial: int = 0,
    enabled: bool = True,
    desc: str | None = None,
    file: IO[str] | None = None,
) -> tqdm:
    """A bar over `total` environment steps (or tokens, updates), starting at `initial`.

    Update it with `bar.update(n)` and show metrics with `set_metrics(bar, {...})`.
    Pass `enabled=dist.is_main` so only rank 0 draws.
    """
    stream = file if file is not None else sys.stderr
    on_terminal = getattr(stream, "isatty", lambda: False)()
    return tqdm(
        total=total,
        initial=initial,
        desc=desc,
        disable=not enabled,
        unit="step",
        unit_scale=True,
        dynamic_ncols=on_terminal,
        mininterval=TERMINAL_INTERVAL_SECONDS if on_terminal else LOG_INTERVAL_SECONDS,
        bar_format=None if on_terminal else _LOG_FORMAT,
        file=stream if on_terminal else _OneLinePerUpdate(stream),
    )


def set_metrics(bar: tqdm, metrics: Mapping[str, Any]) -> None:
    """Show metrics after the rate, e.g. `12.3kstep/s, return=0.52, memory_size=14.2`; a NaN
    (an outcome the env does not report, an interval no episode ended in) is left out."""
    shown = {key: float(value) for key, value in metrics.items()}
    bar.set_postfix({k: v for k, v in shown.items() if math.isfinite(v)}, refresh=False)
