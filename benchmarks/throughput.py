"""Training throughput of train_rl.py and train_lm.py end to end, optionally against a commit.

    python benchmarks/throughput.py [--reference REV] [--repeats 1] [--steps 96000] [--settings ...]

Each setting runs a trainer with its defaults (every core) in a fresh process:
- ``corridor_3_20``: the RL default command on Corridor 3..20, `env.max_length=20` (PPO, 32
  environments, the paper's 2-layer, 64-unit agent, Expire-Span);
- ``corridor_start``: the full Corridor from the start, spans near their initial L/2;
- ``corridor_steady``: the full Corridor with spans as short as a trained agent keeps
  (`memory.init_span_fraction=0.1`, 20 steps);
- ``corridor_a2c``: the paper's learner, `preset=paper` (A2C, 64 environments, one RMSProp
  step per unroll of 6,400 steps);
- ``corridor_compiled``, ``corridor_a2c_compiled``: ``corridor_start`` and ``corridor_a2c``
  acting through a compiled step (`compile_acting=true`; a reference without the setting runs
  them as it acts);
- ``corridor_transformer_xl``, ``corridor_gru``, ``corridor_lstm``: the default with another
  memory (Transformer-XL of span 50);
- ``popgym_expire_span``, ``popgym_gru``, ``popgym_lstm``: `env=popgym` (RepeatPreviousEasy);
- ``two_runs``: two ``corridor_start`` runs started together; their mean rate, and its share
  of ``corridor_start``'s (measured alone in the same invocation, when chosen too);
- ``lm_copy``: train_lm.py on the copy task (the lm.yaml model: 4 layers, 128 units, blocks
  of 128 tokens, 16 streams), 120 updates.
On a GPU (``--settings gpu_...``, not run by default): Corridor 3..20 with the PPO default
(``gpu_ppo_1024``, ``gpu_ppo_4096``) and the paper's A2C (``gpu_a2c_1024``, ``gpu_a2c_4096``)
at 1024 and 4096 environments, `device=cuda`, 12 updates each (a few minutes in all);
``gpu_ppo_1024_compiled`` and ``gpu_a2c_4096_compiled`` act through torch.compile's step.
With ``--reference REV`` the same settings also run from that commit's code (exported with
`git archive`), one after the other in this run, so both see the same machine and load.
``--repeats N`` runs each code N times, in turn (reference, working tree, reference, ...): a
short run varies by 10-25% on a shared machine (the LM copy task's 120 updates gave 0.75-1.06
of the same reference in four invocations), so a ratio of one pair says little.

Prints one JSON object per run, {"setting", "code", "per_s", "unit", "memory_size"}, with
per_s the mean of the logged rate (environment steps or tokens per second) after the first
logging interval (start-up excluded), and for two_runs "share_of_alone" (and "repeat" with
--repeats); then, with a reference, one {"setting", "ratio"} per setting: the median over
repeats of the working tree's rate over the reference's, with "ratio_min" and "ratio_max"
when there are several.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
WORKING_TREE = "working tree"


class Setting(NamedTuple):
    script: str
    overrides: list[str]
    unit: str  # what the rate counts
    rate_key: str  # the metric the trainer logs it as
    total_steps: int | None = None  # fixed length of the run; None: --steps
    processes: int = 1  # runs started together, each with the trainer's defaults


RL_COMMON = ["log_interval=5", "eval.after_training=false"]
POPGYM = ["env=popgym", *RL_COMMON]


def rl(*overrides: str, processes: int = 1) -> Setting:
    return Setting("train_rl.py", [*overrides, *RL_COMMON], "steps", "sps", processes=processes)


SETTINGS = {
    "corridor_3_20": rl("env.max_length=20"),
    "corridor_start": rl(),
    "corridor_steady": rl("memory.init_span_fraction=0.1"),
    "corridor_a2c": rl("preset=paper"),
    "corridor_compiled": rl("++compile_acting=true"),
    "corridor_a2c_compiled": rl("preset=paper", "++compile_acting=true"),
    "corridor_transformer_xl": rl("memory=transformer_xl", "memory.max_span=50"),
    "corridor_gru": rl("memory=gru"),
    "corridor_lstm": rl("memory=lstm"),
    "popgym_expire_span": rl("env=popgym"),
    "popgym_gru": rl("env=popgym", "memory=gru"),
    "popgym_lstm": rl("env=popgym", "memory=lstm"),
    "two_runs": rl(processes=2),
    "lm_copy": Setting(
        "train_lm.py",
        ["task=copy", "log_interval=20", "eval_interval=1000"],
        "tokens",
        "tokens_per_s",
        total_steps=120,
    ),
}
GPU_UPDATES = 12  # (the first logging interval, 5 updates, is start-up)
for learner, preset in (("ppo", "preset=default"), ("a2c", "preset=paper")):
    for envs in (1024, 4096):
        SETTINGS[f"gpu_{learner}_{envs}"] = Setting(
            "train_rl.py",
            [preset, "device=cuda", f"num_envs={envs}", "env.max_length=20", *RL_COMMON],
            "steps",
            "sps",
            total_steps=GPU_UPDATES * envs * 100,  # (unroll_len 100)
        )
for name in ("gpu_ppo_1024", "gpu_a2c_4096"):  # acting compiled by torch.compile
    gpu = SETTINGS[name]
    SETTINGS[f"{name}_compiled"] = gpu._replace(overrides=[*gpu.overrides, "compile_acting=true"])
CPU_SETTINGS = [name for name in SETTINGS if not name.startswith("gpu_")]
ALONE = {"two_runs": "corridor_start"}  # the setting a shared run is compared with


def run_trainers(code_dir: Path, script: str, overrides: list[str], count: int) -> list[list[dict]]:
    """Runs ``count`` processes of ``code_dir``/``script`` with ``overrides`` at once, each in
    a temporary run directory; returns each one's metrics lines."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dirs = [Path(tmp, str(i)) for i in range(count)]
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(code_dir / script),
                    *overrides,
                    "checkpoint_interval=1000",
                    "wandb.mode=disabled",
                    f"hydra.run.dir={run_dir}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=tmp,
            )
            for run_dir in run_dirs
        ]
        for process in processes:
            _, stderr = process.communicate()
            if process.returncode:
                raise RuntimeError(f"{script} {' '.join(overrides)} failed: {stderr.decode()}")
        return [[json.loads(line) for line in (d / "metrics.jsonl").open()] for d in run_dirs]


def measure(code_dir: Path, setting: Setting, steps: int) -> dict:
    """One run (or ``setting.processes`` together) of ``setting`` with the code in
    ``code_dir``: the mean rate after the first logging interval, over the runs."""
    overrides = [*setting.overrides, f"total_steps={setting.total_steps or steps}"]
    rates, sizes = [], []
    for lines in run_trainers(code_dir, setting.script, overrides, setting.processes):
        lines = [line for line in lines if setting.rate_key in line]
        timed = lines[1:] or lines
        rates += [line[setting.rate_key] for line in timed]
        sizes += [line["memory_size"] for line in timed]
    return {
        "per_s": round(sum(rates) / len(rates)),
        "unit": setting.unit,
        "memory_size": round(sum(sizes) / len(sizes), 1),
    }


def export_commit(revision: str, into: Path) -> str:
    """Writes the files of commit ``revision`` into ``into``; returns its short hash."""
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{revision}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def code_versions(reference: str | None, into: Path) -> dict[str, Path]:
    """The code to measure, by name: ``reference`` exported into ``into`` (measured first),
    if given, then the working tree."""
    codes = {export_commit(reference, into): into} if reference else {}
    return {**codes, WORKING_TREE: ROOT}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=96000, help="steps per RL run")
    parser.add_argument("--settings", nargs="+", default=CPU_SETTINGS, choices=SETTINGS)
    parser.add_argument("--reference", help="a commit to measure the same way, e.g. HEAD~3")
    parser.add_argument(
        "--repeats", type=int, default=1, help="runs of each code per setting, taken in turn"
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    with tempfile.TemporaryDirectory() as reference_dir:
        codes = code_versions(args.reference, Path(reference_dir))
        measured: dict[tuple[str, str, int], int] = {}  # (setting, code, repeat) -> rate
        for setting in args.settings:
            rates: dict[str, list[int]] = {code: [] for code in codes}
            for repeat in range(args.repeats):
                for code, code_dir in codes.items():
                    result = measure(code_dir, SETTINGS[setting], args.steps)
                    rates[code].append(result["per_s"])
                    alone = measured.get((ALONE.get(setting, ""), code, repeat))
                    if alone:
                        result["share_of_alone"] = round(result["per_s"] / alone, 2)
                    measured[setting, code, repeat] = result["per_s"]
                    line = {"setting": setting, "code": code, **result}
                    if args.repeats > 1:
                        line["repeat"] = repeat
                    print(json.dumps(line), flush=True)
            if args.reference:
                print(json.dumps({"setting": setting, **paired_ratio(rates)}), flush=True)


def paired_ratio(rates: dict[str, list[int]]) -> dict:
    """The working tree's rate over the reference's, per repeat (runs taken in turn share the
    machine's drift): their median, and with several repeats their range."""
    reference, tree = rates.values()
    ratios = sorted(new / old for new, old in zip(tree, reference, strict=True))
    summary = {"ratio": round(statistics.median(ratios), 2)}
    if len(ratios) > 1:
        summary["ratio_min"], summary["ratio_max"] = round(ratios[0], 2), round(ratios[-1], 2)
    return summary


if __name__ == "__main__":
    main()
