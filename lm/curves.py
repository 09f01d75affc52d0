"""The learning curves of a train_lm.py run (RUN_DIR/curves.png, drawn when it finishes).

`analysis.curves` draws RL runs against environment steps and needs `memory_size` in every
record; a language-model run logs training and validation metrics at different intervals, so
here each series is drawn at the updates that logged it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.figure import Figure  # drawn with Agg, without pyplot's global state

# (panel title, [(metric, legend label)]): a panel per quantity, a line per split
LOSSES = ("loss (nats per scored token)", [("train_loss", "train"), ("valid_loss", "valid")])
MEMORY = ("average memory size", [("memory_size", "train"), ("valid_memory_size", "valid")])


def series(records: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The updates that logged `key` and its values there (null, as NaN is written, skipped)."""
    logged = [r for r in records if r.get(key) is not None]
    return [r["step"] for r in logged], [r[key] for r in logged]


def plot_lm_curves(records: Sequence[dict[str, Any]], metric: str) -> Figure:
    """Panels of the losses, the task metric (e.g. valid_bpb, valid_error) and the memory size
    against updates, from the records of a run's metrics.jsonl."""
    panels = [LOSSES, (metric, [(metric, "valid")]), MEMORY]
    figure = Figure(figsize=(4.5 * len(panels), 4), layout="constrained")
    for axes, (title, lines) in zip(figure.subplots(1, len(panels)), panels, strict=True):
        for key, label in lines:
            steps, values = series(records, key)
            if steps:
                axes.plot(steps, values, lw=1, marker="." if len(steps) < 30 else None, label=label)
        axes.set_title(title, fontsize=10)
        axes.set_xlabel("updates")
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend(fontsize=8)
    return figure
