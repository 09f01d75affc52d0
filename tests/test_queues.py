"""The queues of runs (scripts/*.sh on scripts/lanes.sh): every run they would start is a
command its trainer accepts, named once, on the seeds the docs say."""

import os
import subprocess

import pytest
from hydra import compose, initialize_config_dir

from scripts import ROOT, load_script

QUEUES = (
    "tuning.sh",
    "suite.sh",
    "corridor_headline.sh",
    "lm_tuning.sh",
    "collision_easy.sh",
    "instruction_memory.sh",
)


def queued_runs(script: str, cwd) -> dict[str, list[str]]:
    """NAME -> [trainer, overrides...] of each run the queue would start (LANES_PRINT=1)."""
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / script)],
        cwd=cwd,
        env=dict(os.environ, LANES_PRINT="1"),
        capture_output=True,
        text=True,
        check=True,
    )
    runs = {}
    for line in result.stdout.splitlines():
        name, command = line.split(": python ")
        assert name not in runs, f"{script} queues {name} twice"
        runs[name] = command.split()
    return runs


@pytest.mark.slow  # (the config check of every setting queued)
@pytest.mark.parametrize("script", QUEUES)
def test_every_queued_run_is_a_command_its_trainer_accepts(script, tmp_path):
    (tmp_path / "configs/tuned").mkdir(parents=True)  # suite.sh waits for the tuning's choices
    for memory in ("expire_span", "transformer_xl", "gru", "lstm"):
        (tmp_path / f"configs/tuned/{memory}.yaml").write_text("# @package _global_\n")
    runs = queued_runs(script, tmp_path)
    assert runs
    held_out = script not in ("tuning.sh", "lm_tuning.sh")
    settings = set()  # each run's command but its seed, checked once
    for name, command in runs.items():
        seed = int(next(arg for arg in command if arg.startswith("seed=")).split("=")[1])
        assert (seed >= 200) if held_out else (0 <= seed <= 9), f"{name}: seed {seed}"
        settings.add(tuple(arg for arg in command if not arg.startswith("seed=")))
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        for trainer, *overrides in settings:
            cfg = compose("rl" if trainer == "train_rl.py" else "lm", overrides=overrides)
            load_script(trainer.removesuffix(".py")).check_config(cfg)


def test_the_suite_waits_for_the_tuning(tmp_path):
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/suite.sh")],
        cwd=tmp_path,
        env=dict(os.environ, LANES_PRINT="1"),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "configs/tuned/expire_span.yaml is missing" in result.stderr


FAKE_TRAINER = """import pathlib, sys
run = pathlib.Path(sys.argv[-1].removeprefix("hydra.run.dir="))
run.mkdir(parents=True)
if sys.argv[1] == "failing":
    sys.exit(1)
for name in ("config.yaml", "metrics.jsonl", "eval.json"):
    (run / name).write_text(name)
"""


def test_a_kept_run_gets_its_after_run_and_a_failed_one_nothing(tmp_path):
    """lanes.sh keeps a finished run's files and then calls the queue's after_run on it; a run
    whose trainer fails is not kept, and an after_run that fails is logged with the run kept.
    probe_test_split leaves nothing behind when its probe fails."""
    (tmp_path / "fake.py").write_text(FAKE_TRAINER)
    (tmp_path / "queue.sh").write_text(
        f'source "{ROOT}/scripts/lanes.sh"\n'
        "names=(good failing unprobed)\n"
        'run_args() { echo "fake.py $1"; }\n'
        'after_run() { [ "${1##*/}" != unprobed ] && echo "$1" >"$2/probe"; }\n'
        "run_lanes 1 runs kept\n"
        "probe_test_split instruction_probe runs/missing kept/good || echo refused\n"
    )
    result = subprocess.run(
        ["bash", "queue.sh"], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert result.stdout == "refused\n"
    kept = tmp_path / "kept"
    assert sorted(p.name for p in kept.iterdir()) == ["good", "unprobed"]
    assert sorted(p.name for p in (kept / "good").iterdir()) == [
        "config.yaml",
        "eval.json",
        "metrics.jsonl",
        "probe",
    ]
    assert (kept / "good" / "probe").read_text() == "runs/good\n"
    assert not (kept / "unprobed" / "probe").exists()
    assert "after_run unprobed failed" in (tmp_path / "runs" / "lane1.log").read_text()
