"""Performance against average memory size, one point per run (the paper's figures 4 and 5).

    python -m analysis.plot SWEEP_DIR [SWEEP_DIR ...] --out OUT_DIR [--markdown]

Each SWEEP_DIR is a Hydra `-m` sweep (SWEEP_DIR/<job number>/config.yaml, metrics.jsonl),
a single run directory, or a directory holding several of either. Writes to OUT_DIR:

- runs.csv: one row per run, its final metric, memory size, training time, last return and
  whether it held what it learned;
- settings.csv: one row per setting, i.e. runs that differ only in their seed, with the mean
  and standard deviation of their final metric, memory size, training time and last return,
  and how many of its runs held;
- one PNG per task, e.g. corridor_success.png: every run a faint point, every setting its
  mean with one-standard-deviation error bars; the settings of a memory kind that differ
  only in their span (e.g. Transformer-XL at several spans) are joined by a line;
- overview.png, all those panels side by side, when there are several.

`--markdown` prints the settings as markdown tables, one per figure, each followed, where the
figure has an Expire-Span setting and another, by the probability that a run of each
Expire-Span setting ends better than a run of every other setting, with its 95% bootstrap
interval (rliable; the "beats" or "matches" of a single task) and the p of a permutation test
of it (a difference is resolved where both show it), and where there are several
figures (a suite of tasks) one more, a row per task and a column per memory setting; for RL runs
over several tasks also the rliable aggregate (`analysis.aggregate`: normalised final scores and
POPGym's MMER per task, IQM and probability of improvement across seeds and learned tasks), and
draws it in aggregate.png (needs the `stats` extra). Runs of several budgets (total_steps) get
these two for each budget, the figure in aggregate_<steps>.png. Every interval comes from
`--bootstrap-reps` samples (2,000 by default; rliable's own default, 50,000, narrows the
intervals' own noise at 25 times the time).

The task is the env config's name (corridor, portal, ...) or the LM task's, except for the
env configs that take any Gymnasium id (env=gym, env=popgym), where it is the id: a POPGym
sweep gives one figure per POPGym task.

A run's final metric, memory size, training time, last return and whether it held:
`analysis.results`; which runs make a setting: `analysis.settings`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from analysis.aggregate import BOOTSTRAP_REPS
from analysis.figures import write_figures
from analysis.results import FINAL_POINTS, PlotError
from analysis.settings import Setting, collect, summarize
from analysis.tables import markdown_tables, write_runs_csv, write_settings_csv


def plot_sweeps(
    sweep_dirs: Sequence[str | os.PathLike],
    out_dir: Path,
    metric: str | None = None,
    last: int | None = None,
    logx: bool = False,
) -> tuple[list[Path], list[Setting]]:
    """Read every run, write runs.csv, settings.csv, one PNG per (group, metric) and, when
    there are several, overview.png with all of them.

    Returns the written paths and the settings (in figure order, as in settings.csv).
    """
    results = collect(sweep_dirs, metric, last)
    settings = summarize(results)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "runs.csv", out_dir / "settings.csv"]
    write_runs_csv(results, written[0])
    write_settings_csv(settings, written[1])
    return written + write_figures(settings, out_dir, logx), settings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.plot",
        description="Plot final performance against average memory size, one point per run.",
    )
    parser.add_argument("sweep_dirs", nargs="+", help="Hydra sweep directories or run directories")
    parser.add_argument("--out", required=True, type=Path, help="directory for the CSVs and PNGs")
    parser.add_argument("--metric", help="metrics.jsonl key to plot instead of the task's default")
    parser.add_argument(
        "--last",
        type=int,
        help=f"final value = mean of this many last logged points (default: {FINAL_POINTS} "
        "for training metrics, 1 for validation metrics)",
    )
    parser.add_argument("--logx", action="store_true", help="log-scale memory-size axis")
    parser.add_argument(
        "--markdown",
        action="store_true",
        help="print the settings as markdown tables on stdout (the written files go to stderr)",
    )
    parser.add_argument(
        "--bootstrap-reps",
        type=int,
        default=BOOTSTRAP_REPS,
        help=f"bootstrap samples of each --markdown interval (default: {BOOTSTRAP_REPS})",
    )
    args = parser.parse_args(argv)
    if args.last is not None and args.last < 1:
        parser.error(f"--last={args.last} must be at least 1")
    if args.bootstrap_reps < 1:
        parser.error(f"--bootstrap-reps={args.bootstrap_reps} must be at least 1")
    try:
        written, settings = plot_sweeps(
            args.sweep_dirs, args.out, args.metric, args.last, args.logx
        )
    except PlotError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print("\n".join(map(str, written)), file=sys.stderr if args.markdown else sys.stdout)
    if args.markdown:
        print("\n\n".join(markdown_tables(settings, args.out, args.bootstrap_reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
