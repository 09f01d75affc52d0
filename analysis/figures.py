"""Final metric against average memory size (the paper's figures 4 and 5): every run a faint
point, every setting its mean with one-standard-deviation error bars, a colour and marker per
memory kind. Drawn with Agg, without pyplot's global state."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis.settings import KIND_STYLES, Setting, by_figure
from training.files import atomic_open

OTHER_STYLES = [  # colour, marker for any other kind
    ("tab:orange", "v"),
    ("tab:brown", "P"),
    ("tab:pink", "*"),
    ("tab:olive", "h"),
    ("tab:cyan", "<"),
]
METRIC_LABELS = {
    "success": "success rate",
    "rooms_reached": "rooms reached",
    "return": "episode return",
    "mmer": "MMER (best interval mean return)",
    "valid_bpb": "validation bits per byte (lower is better)",
    "valid_accuracy": "validation accuracy",
    "valid_error": "validation error (lower is better)",
    "test_bpb": "test bits per byte (lower is better)",
    "test_accuracy": "test accuracy",
    "test_error": "test error (lower is better)",
}


def write_figures(settings: Sequence[Setting], out_dir: Path, logx: bool = False) -> list[Path]:
    """One PNG per (group, metric) with a memory size and, when there are several, overview.png
    with all of them; returns the written paths."""
    written, panels = [], []
    for (group, metric), panel in by_figure(settings).items():
        if all(s.memory_size is None for s in panel):
            print(f"{group}: no run logged a memory size; no figure", file=sys.stderr)
            continue
        panels.append(panel)
        written.append(out_dir / f"{_file_name(group)}_{metric}.png")
        save_png(plot_panel(panel, logx), written[-1])
    if len(panels) > 1:
        written.append(out_dir / "overview.png")
        save_png(plot_overview(panels, logx), written[-1])
    return written


def plot_panel(settings: Sequence[Setting], logx: bool = False) -> Figure:
    """One figure: final metric against memory size, a colour and marker per memory kind."""
    figure = Figure(figsize=(5.5, 4), layout="constrained")
    draw_panel(figure.subplots(), settings, logx)
    return figure


def plot_overview(panels: Sequence[Sequence[Setting]], logx: bool = False) -> Figure:
    """The panels of several figures (e.g. one per POPGym task) in one image, 3 to a row."""
    columns = min(3, len(panels))
    rows = math.ceil(len(panels) / columns)
    figure = Figure(figsize=(5.5 * columns, 4 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False).flatten()
    for ax, settings in zip(axes, panels, strict=False):
        draw_panel(ax, settings, logx)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    return figure


def draw_panel(axes: Axes, settings: Sequence[Setting], logx: bool = False) -> None:
    """Final metric against memory size on `axes`, a colour and marker per memory kind."""
    for kind, (label, colour, marker) in _kind_styles(s.kind for s in settings).items():
        ours = [s for s in settings if s.kind == kind and s.memory_size is not None]
        if not ours:
            continue
        runs = [run for s in ours for run in s.runs if run.memory_size is not None]
        axes.scatter(
            [run.memory_size for run in runs],
            [run.final for run in runs],
            color=colour,
            marker=marker,
            s=18,
            alpha=0.35,
            label=f"_{kind} runs",  # a leading underscore keeps it out of the legend
        )
        ours.sort(key=lambda s: s.memory_size[0])
        if len(ours) == 1 and ours[0].max_span is not None:
            label += f" ($L$={ours[0].max_span})"
        span_sweep = len(ours) > 1 and not any(s.setting for s in ours)
        axes.errorbar(
            [s.memory_size[0] for s in ours],
            [s.final[0] for s in ours],
            xerr=[s.memory_size[1] for s in ours],
            yerr=[s.final[1] for s in ours],
            color=colour,
            marker=marker,
            markersize=7,
            linestyle="-" if span_sweep else "none",  # a line only through a span sweep
            capsize=3,
            label=label,
        )
        if len(ours) > 1:
            show_span = len({s.max_span for s in ours}) > 1
            for s in ours:
                axes.annotate(
                    _note(s, show_span),
                    (s.memory_size[0], s.final[0]),
                    textcoords="offset points",
                    xytext=(6, 4),
                    fontsize=7,
                    color=colour,
                )
    metric, group = settings[0].metric, settings[0].group
    axes.set_xlabel("average memory size $|C_t|$")
    axes.set_ylabel(METRIC_LABELS.get(metric, metric))
    axes.set_title(group)  # the axis labels say what is plotted
    if logx:
        axes.set_xscale("log")
    axes.margins(0.1)  # room for the annotations at the edges
    axes.grid(alpha=0.3)
    axes.legend()


def save_png(figure: Figure, path: Path) -> None:
    """The figure as a PNG, written atomically: a sweep can be replotted while it runs."""
    with atomic_open(path, "wb") as file:
        figure.savefig(file, format="png", dpi=150)


def _note(setting: Setting, show_span: bool) -> str:
    """A setting's annotation in the figure: "$L$=10 ramp=2" for memory.max_span=10 and
    memory.ramp=2 (config keys shortened to their last part)."""
    other = re.sub(r"(?:\w+\.)+(\w+)=", r"\1=", setting.setting)
    return " ".join(
        part for part in (f"$L$={setting.max_span}" if show_span else "", other) if part
    )


def _kind_styles(kinds: Iterable[str]) -> dict[str, tuple[str, str, str]]:
    """Label, colour and marker of each kind present: known kinds first, in a fixed order."""
    present = set(kinds)
    styles = {kind: KIND_STYLES[kind] for kind in KIND_STYLES if kind in present}
    for index, kind in enumerate(sorted(present - set(KIND_STYLES))):
        styles[kind] = (kind, *OTHER_STYLES[index % len(OTHER_STYLES)])
    return styles


def _file_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")
