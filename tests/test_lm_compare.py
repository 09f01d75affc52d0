"""benchmarks/lm_compare.py: the runs it plans and the train_lm.py commands it builds."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from scripts import ROOT, load_script

lm_compare = load_script("benchmarks/lm_compare")
train_lm = load_script("train_lm")


def compose_config(command: list[str]):
    """The config a train_lm.py command would run with (its hydra.* settings left out)."""
    overrides = [arg for arg in command[2:] if not arg.startswith("hydra.")]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose("lm", overrides=overrides)


def test_copy_runs_expire_span_against_a_short_and_a_full_transformer_xl():
    runs = lm_compare.planned_runs(["copy"], ["expire_span", "transformer_xl"])
    assert runs == [
        ("copy", "expire_span", 256),
        ("copy", "transformer_xl", 16),
        ("copy", "transformer_xl", 128),
    ]
    assert lm_compare.planned_runs(["copy"], ["transformer_xl"]) == runs[1:]
    # relative positions reach block_len - 1 tokens back: far enough to place every A
    cfg = compose_config(lm_compare.train_command(*runs[0], 10, 0, ROOT, ROOT))
    assert cfg.memory.block_len > cfg.task.distance + 2 * cfg.task.max_count
    assert lm_compare.planned_runs(["text", "copy"], ["expire_span"]) == [
        ("text", "expire_span", 1024),
        ("copy", "expire_span", 256),
    ]


@pytest.mark.parametrize("task", list(lm_compare.TASKS))
def test_each_run_has_its_own_directory_span_and_seed(task, tmp_path):
    runs = lm_compare.planned_runs([task], ["expire_span", "transformer_xl"])
    commands = [
        lm_compare.train_command(*run, steps=10, seed=3, out=tmp_path, corpus=Path(__file__))
        for run in runs
    ]
    run_dirs = [arg for command in commands for arg in command if arg.startswith("hydra.run.dir=")]
    assert run_dirs == [f"hydra.run.dir={tmp_path / f'{t}-{k}-{s}'}" for t, k, s in runs]
    for (_, kind, span), command in zip(runs, commands, strict=True):
        cfg = compose_config(command)
        train_lm.check_config(cfg)
        assert (cfg.task.name, cfg.memory.kind, cfg.memory.max_span) == (task, kind, span)
        assert (cfg.seed, cfg.total_steps) == (3, 10)
