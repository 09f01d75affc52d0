"""Tests for agents.plot on run directories written with training's own config and metrics."""

from __future__ import annotations

import csv
import math
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.image import imread
from omegaconf import OmegaConf

from agents.plot import FINAL_POINTS, main, plot_panel, read_run
from training import MetricsLogger, save_resolved_config


def make_run(run_dir, cfg, records):
    """A run directory as a trainer leaves it: resolved config.yaml and metrics.jsonl."""
    run_dir.mkdir(parents=True)
    cfg = OmegaConf.create({**cfg, "wandb": {"mode": "disabled"}})
    save_resolved_config(run_dir, cfg)
    with MetricsLogger(run_dir, cfg) as logger:
        for record in records:
            logger.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])


def rl_config(kind, max_span, seed, env="corridor"):
    return {"env": {"name": env}, "memory": {"kind": kind, "max_span": max_span}, "seed": seed}


def rl_records(successes, memory_sizes):
    return [
        {"step": 1000 * (i + 1), "success": s, "memory_size": m, "return": s}
        for i, (s, m) in enumerate(zip(successes, memory_sizes, strict=True))
    ]


def final(values):
    tail = [v for v in values if not math.isnan(v)][-FINAL_POINTS:]
    return sum(tail) / len(tail)


@pytest.fixture
def corridor_sweep(tmp_path):
    """A Hydra -m sweep: jobs 0..10, two of them without anything to plot."""
    sweep = tmp_path / "sweep"
    expected = {}
    specs = {
        0: ("expire_span", 200, 0),
        1: ("expire_span", 200, 1),
        2: ("expire_span", 200, 2),
        3: ("transformer_xl", 10, 0),
        4: ("transformer_xl", 50, 0),
        5: ("transformer_xl", 100, 0),
        6: ("transformer_xl", 200, 0),
        7: ("lstm", None, 0),
        10: ("expire_span", 200, 3),
    }
    for job, (kind, span, seed) in specs.items():
        successes = [0.1 * ((job + i) % 10) for i in range(8)]
        successes[6] = math.nan  # an interval in which no episode ended: logged as null
        memory_sizes = [float(span or 1) * (0.5 + 0.05 * i) + job for i in range(8)]
        make_run(sweep / str(job), rl_config(kind, span, seed), rl_records(successes, memory_sizes))
        expected[job] = (kind, span, final(successes), final(memory_sizes))
    (sweep / "8").mkdir()
    save_resolved_config(sweep / "8", OmegaConf.create(rl_config("expire_span", 200, 4)))
    (sweep / "9" / ".hydra").mkdir(parents=True)  # the job failed before writing config.yaml
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    return sweep, expected


def test_sweep_gives_one_csv_row_per_run_with_final_means(corridor_sweep, tmp_path, capsys):
    sweep, expected = corridor_sweep
    out = tmp_path / "plots"
    assert main([str(sweep), "--out", str(out)]) == 0

    with open(out / "runs.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["run_dir"] for row in rows] == [str(sweep / str(job)) for job in expected]
    for row, (kind, span, success, memory_size) in zip(rows, expected.values(), strict=True):
        assert row["kind"] == kind
        assert row["max_span"] == ("" if span is None else str(span))
        assert row["metric"] == "success"
        assert float(row["final"]) == pytest.approx(success)
        assert float(row["memory_size"]) == pytest.approx(memory_size)
        assert row["steps"] == "8000"
    assert rows[-1]["seed"] == "3"

    warnings = capsys.readouterr().err
    assert "skipped 2 run(s)" in warnings
    assert f"{sweep / '8'}: no metrics.jsonl yet" in warnings
    assert f"{sweep / '9'}: no config.yaml" in warnings

    image = imread(out / "corridor_success.png")
    assert image.shape[:2] == (600, 825)  # 5.5 x 4 inches at 150 dpi


def test_panel_draws_each_kind_apart_at_its_memory_size(corridor_sweep):
    sweep, expected = corridor_sweep
    results = [read_run(sweep / str(job)) for job in expected]
    axes = plot_panel(results).axes[0]
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == ["Expire-Span", "Transformer-XL", "LSTM"]
    points = {
        label: sorted(map(tuple, collection.get_offsets().tolist()))
        for label, collection in zip(labels, axes.collections, strict=True)
    }
    expire = sorted((m, s) for kind, _, s, m in expected.values() if kind == "expire_span")
    np.testing.assert_allclose(points["Expire-Span"], expire)
    assert len(points["Transformer-XL"]) == 4
    assert axes.get_xlabel() == "average memory size $|C_t|$"


@pytest.mark.parametrize(
    ("cfg", "logged", "metric"),
    [
        (rl_config("expire_span", 100, 0, env="portal"), "rooms_reached", "rooms_reached"),
        (rl_config("expire_span", 100, 0, env="minigrid_memory"), "return", "return"),
        (
            {"task": {"name": "enwik8"}, "memory": {"kind": "expire_span"}, "seed": 0},
            "valid_bpb",
            "valid_bpb",
        ),
        (
            {"task": {"name": "copy"}, "memory": {"kind": "transformer_xl"}, "seed": 0},
            "valid_accuracy",
            "valid_accuracy",
        ),
        (
            {"task": {"name": "collision"}, "memory": {"kind": "expire_span"}, "seed": 0},
            "valid_error",
            "valid_error",
        ),
    ],
)
def test_metric_follows_the_env_or_task(tmp_path, cfg, logged, metric):
    records = [
        {"step": step, logged: 0.5 + step, "loss": 1.0, "memory_size": 3.0} for step in range(10)
    ]
    make_run(tmp_path / "run", cfg, records)
    result = read_run(tmp_path / "run")
    assert result.metric == metric
    assert result.final == pytest.approx(0.5 + sum(range(5, 10)) / 5)
    assert read_run(tmp_path / "run", metric="loss", last=2).final == 1.0


def test_a_single_run_directory_is_accepted(tmp_path):
    make_run(tmp_path / "run", rl_config("expire_span", 64, 7), rl_records([1.0], [5.0]))
    assert main([str(tmp_path / "run"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "corridor_success.png").is_file()


def test_bad_input_exits_2_with_a_clear_message(tmp_path, capsys):
    def error_of(*argv):
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
        return capsys.readouterr().err

    assert f"{tmp_path / 'missing'} does not exist" in error_of(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    assert f"no runs under {tmp_path / 'empty'}" in error_of(str(tmp_path / "empty"))

    make_run(tmp_path / "early" / "0", rl_config("expire_span", 200, 0), [])
    message = error_of(str(tmp_path / "early"))
    assert "metrics.jsonl is empty" in message and "no run has usable metrics yet" in message

    config = rl_config("expire_span", 200, 0)
    del config["memory"]["kind"]
    make_run(tmp_path / "foreign" / "0", config, rl_records([1.0], [5.0]))
    message = error_of(str(tmp_path / "foreign"))
    assert f"{tmp_path / 'foreign' / '0' / 'config.yaml'} has no memory.kind" in message
    assert not (tmp_path / "out").exists()


def test_command_line_error_has_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "agents.plot", str(tmp_path / "nope"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == f"python -m agents.plot: error: {tmp_path / 'nope'} does not exist\n"
