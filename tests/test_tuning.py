"""The tuning grid's choice: each memory runs at the setting with its best mean final score,
chosen only when every memory had the same runs, and written where its runs read it."""

import shutil
from pathlib import Path

from hydra import compose, initialize_config_dir
from test_plot import make_run, rl_config

from analysis.tuning import main

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SETTINGS = [(4, "constant"), (4, "linear"), (8, "constant"), (8, "linear")]


def tuning_run(root, kind, epochs, schedule, seed, level):
    """A POPGym tuning run whose interval returns sit at `level` (its final score (level+1)/2)."""
    cfg = rl_config(kind, None, seed, env="popgym")
    cfg["env"]["id"] = "popgym:popgym-RepeatPreviousEasy-v0"
    cfg["agent"] = {"epochs": epochs, "lr_schedule": schedule}
    records = [
        {"step": 16_000 * (i + 1), "return": level, "mmer": level, "memory_size": 1.0}
        for i in range(10)
    ]
    make_run(root / f"{kind}-e{epochs}-{schedule}-{seed}", cfg, records)


def test_each_memory_gets_its_best_setting_written_where_its_runs_read_it(tmp_path, capsys):
    best = {"gru": (4, "constant"), "expire_span": (8, "linear")}
    for kind, chosen in best.items():
        for epochs, schedule in SETTINGS:
            for seed in (0, 1):
                level = 0.5 if (epochs, schedule) == chosen else 0.1 * seed
                tuning_run(tmp_path / "runs", kind, epochs, schedule, seed, level)
    configs = tmp_path / "configs"
    shutil.copytree(CONFIGS, configs, ignore=shutil.ignore_patterns("tuned"))  # (ours only)
    assert main([str(tmp_path / "runs"), "--write", str(configs / "tuned")]) == 0
    table = capsys.readouterr().out
    assert "| gru | 4 | constant | 0.750 | 0.750 | 2 | yes |" in table
    assert "| gru | 8 | linear | 0.525 | 0.525 | 2 |  |" in table
    assert (
        "mean final score 0.750 over 2 runs (seeds 0, 1)"
        in (configs / "tuned/gru.yaml").read_text()
    )
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        for kind, (epochs, schedule) in best.items():
            for benchmark in ("repeat_previous_easy", "memory_s13_random"):
                cfg = compose("rl", [f"memory={kind}", "+sweep=suite", f"+benchmark={benchmark}"])
                assert (cfg.agent.epochs, cfg.agent.lr_schedule) == (epochs, schedule)
        corridor = compose("rl", ["memory=gru"])  # (the Corridor's own settings)
        assert (corridor.agent.epochs, corridor.agent.lr_schedule) == (8, "linear")
        assert compose("rl", ["memory=lstm", "env=popgym"]).agent.epochs == 4  # (not tuned)


def test_no_choice_is_written_unless_every_memory_had_the_same_runs(tmp_path, capsys):
    for epochs, schedule in SETTINGS:
        tuning_run(tmp_path / "runs", "gru", epochs, schedule, 0, 0.2)
        if (epochs, schedule) != (8, "linear"):
            tuning_run(tmp_path / "runs", "expire_span", epochs, schedule, 0, 0.2)
    assert main([str(tmp_path / "runs"), "--write", str(tmp_path / "tuned")]) == 2
    error = capsys.readouterr().err
    assert "expire_span (8, 'linear')" in error and "finish the grid first" in error
    assert not (tmp_path / "tuned").exists()
