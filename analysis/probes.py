"""The probes kept beside a sweep's runs, one row per setting: where `analysis.plot` says how
well each memory does, these say why.

    python -m analysis.probes SWEEP_DIR [SWEEP_DIR ...] --file instruction_probe_test.json

A probe (`analysis.instruction_probe`, `analysis.collision_probe`) prints one JSON object of
groups, each an accuracy or an error with its count (the executions by part and by distance;
the questions by how far back their collision lies). Saved as FILE in a run's directory, it is
read here for every run, the runs grouped into settings as `analysis.plot` groups them, and
each group's accuracy or error averaged over a setting's runs. The header gives a group's count
where every run has the same one (a probe of one split counts the same executions whatever the
model), and the table the runs each setting has a probe of. Runs without FILE are named on
stderr and left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from analysis.results import PlotError
from analysis.settings import Setting, collect, setting_label, summarize, warn

SCORES = ("accuracy", "error")  # what a probe's group reports, with its "count"


def probe_groups(probe: dict[str, Any], name: str = "all") -> dict[str, tuple[str, Any, int]]:
    """A probe's groups, at any depth, by their own key ("all" for the top level): (the score's
    name, its value or None for an empty group, its count)."""
    groups = {}
    for score in SCORES:
        if score in probe:
            groups[name] = (score, probe[score], probe["count"])
    for key, value in probe.items():
        if isinstance(value, dict):
            groups.update(probe_groups(value, key))
    return groups


def probe_table(settings: Sequence[Setting], file_name: str) -> tuple[str, list[str]]:
    """A markdown table of each setting's mean score per probe group (over its runs with a
    probe), and the runs that have no FILE_NAME."""
    rows, missing = [], []
    for setting in settings:
        probes = []
        for run in setting.runs:
            path = Path(run.run_dir) / file_name
            if path.is_file():
                try:
                    probes.append(probe_groups(json.loads(path.read_text())))
                except (json.JSONDecodeError, KeyError) as error:
                    raise PlotError(
                        f"{path} is not a probe's JSON ({error!r}): probe again"
                    ) from None
            else:
                missing.append(run.run_dir)
        if probes:
            rows.append((setting, probes))
    if not rows:
        raise PlotError(f"no run has a {file_name}: save a probe's output there first")
    names = list(dict.fromkeys(name for _, probes in rows for p in probes for name in p))
    header = ["memory", "max span", "probed runs"]
    for name in names:
        found = [p[name] for _, probes in rows for p in probes if name in p]
        counts = {count for _, _, count in found}
        score = found[0][0]
        count = f", {counts.pop():,}" if len(counts) == 1 else ""
        header.append(f"{name} ({score}{count})")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for setting, probes in rows:
        row = [
            setting_label(setting, with_span=False),
            "" if setting.max_span is None else str(setting.max_span),
            str(len(probes)),
        ]
        for name in names:
            values = [p[name][1] for p in probes if name in p and p[name][1] is not None]
            row.append(f"{statistics.fmean(values):.3f}" if values else "")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines), missing


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.probes", description=__doc__)
    parser.add_argument("sweep_dirs", nargs="+", help="Hydra sweep directories or run directories")
    parser.add_argument(
        "--file",
        required=True,
        help="the probe's output in each run directory, e.g. instruction_probe_test.json",
    )
    args = parser.parse_args(argv)
    try:
        table, missing = probe_table(summarize(collect(args.sweep_dirs)), args.file)
    except PlotError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if missing:
        warn(f"{len(missing)} run(s) without {args.file}", missing)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
