"""Tests for analysis.plot: on run directories written with training's own config and metrics
writers, and on a real multirun sweep of train_rl.py."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from omegaconf import OmegaConf
from tiny_rl import TINY_RL

from analysis.figures import plot_panel
from analysis.plot import main
from analysis.probes import main as probes_main
from analysis.probes import probe_groups
from analysis.results import FINAL_POINTS, PlotError, read_run
from analysis.settings import label_settings, summarize
from analysis.tables import markdown_table
from training.metrics import MetricsLogger
from training.run_dir import save_resolved_config

ROOT = Path(__file__).resolve().parents[1]
FIGURE_SHAPE = (600, 825)  # 5.5 x 4 inches at 150 dpi


def make_run(run_dir, cfg, records):
    """A run directory as a trainer leaves it: resolved config.yaml and metrics.jsonl."""
    run_dir.mkdir(parents=True)
    cfg = OmegaConf.create({"wandb": {"mode": "disabled"}, **cfg})
    save_resolved_config(run_dir, cfg)
    with MetricsLogger(run_dir, cfg) as logger:
        for record in records:
            logger.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])


def rl_config(kind, max_span, seed, env="corridor", **memory):
    memory = {"kind": kind, "max_span": max_span, **memory}
    return {"env": {"name": env}, "memory": memory, "seed": seed}


def rl_records(successes, memory_sizes):
    return [
        {"step": 1000 * (i + 1), "success": s, "memory_size": m, "return": s}
        for i, (s, m) in enumerate(zip(successes, memory_sizes, strict=True))
    ]


def final(values, count=FINAL_POINTS):
    tail = [v for v in values if v is not None and not math.isnan(v)][-count:]
    return sum(tail) / len(tail)


def read_csv(path):
    with open(path) as file:
        return list(csv.DictReader(file))


def legend_line(axes, label):
    """The line through the setting means (drawn with error bars) a legend entry stands for."""
    (container,) = [c for c in axes.containers if c.get_label() == label]
    return container.lines[0]


def run_points(axes, kind):
    """The faint per-run points of one memory kind, sorted."""
    (points,) = [c for c in axes.collections if c.get_label() == f"_{kind} runs"]
    return sorted(map(tuple, points.get_offsets().tolist()))


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

    rows = read_csv(out / "runs.csv")
    assert [row["run_dir"] for row in rows] == [str(sweep / str(job)) for job in expected]
    for row, (kind, span, success, memory_size) in zip(rows, expected.values(), strict=True):
        assert row["kind"] == kind
        assert row["max_span"] == ("" if span is None else str(span))
        assert row["metric"] == "success"
        assert row["setting"] == ""
        assert float(row["final"]) == pytest.approx(success)
        assert float(row["memory_size"]) == pytest.approx(memory_size)
        assert row["steps"] == "8000"
    assert rows[-1]["seed"] == "3"

    warnings = capsys.readouterr().err
    assert "skipped 2 run(s)" in warnings
    assert f"{sweep / '8'}: no metrics.jsonl yet" in warnings
    assert f"{sweep / '9'}: no config.yaml" in warnings
    assert "still running" not in warnings  # no total_steps in these configs

    assert imread(out / "corridor_success.png").shape[:2] == FIGURE_SHAPE


def test_seeds_of_one_setting_are_averaged(corridor_sweep, tmp_path):
    sweep, expected = corridor_sweep
    assert main([str(sweep), "--out", str(tmp_path / "out")]) == 0
    rows = read_csv(tmp_path / "out" / "settings.csv")
    assert [(row["kind"], row["max_span"], row["runs"]) for row in rows] == [
        ("expire_span", "200", "4"),
        ("transformer_xl", "10", "1"),
        ("transformer_xl", "50", "1"),
        ("transformer_xl", "100", "1"),
        ("transformer_xl", "200", "1"),
        ("lstm", "", "1"),
    ]
    expire = [(s, m) for kind, _, s, m in expected.values() if kind == "expire_span"]
    assert rows[0]["seeds"] == "0 1 2 3"
    assert float(rows[0]["final_mean"]) == pytest.approx(statistics.mean(s for s, _ in expire))
    assert float(rows[0]["final_std"]) == pytest.approx(statistics.stdev(s for s, _ in expire))
    assert float(rows[0]["memory_size_std"]) == pytest.approx(
        statistics.stdev(m for _, m in expire)
    )
    assert float(rows[1]["final_std"]) == 0.0
    assert float(rows[1]["final_mean"]) == pytest.approx(expected[3][2])


def test_panel_draws_runs_and_setting_means_per_kind(corridor_sweep):
    sweep, expected = corridor_sweep
    settings = summarize(label_settings([read_run(sweep / str(job)) for job in expected]))
    axes = plot_panel(settings).axes[0]
    labels = [text.get_text() for text in axes.get_legend().get_texts()]
    assert labels == ["Expire-Span ($L$=200)", "Transformer-XL", "LSTM"]

    expire = sorted((m, s) for kind, _, s, m in expected.values() if kind == "expire_span")
    np.testing.assert_allclose(run_points(axes, "expire_span"), expire)
    mean = legend_line(axes, labels[0]).get_xydata()
    np.testing.assert_allclose(mean, [np.mean(expire, axis=0)])

    # Transformer-XL: one point per span, joined in order of memory size, each annotated.
    xl = sorted((m, s) for kind, _, s, m in expected.values() if kind == "transformer_xl")
    np.testing.assert_allclose(legend_line(axes, "Transformer-XL").get_xydata(), xl)
    assert legend_line(axes, "Transformer-XL").get_linestyle() == "-"
    assert legend_line(axes, labels[0]).get_linestyle() == "None"
    notes = {text.get_text() for text in axes.texts}
    assert {"$L$=10", "$L$=50", "$L$=100", "$L$=200"} <= notes
    assert axes.get_xlabel() == "average memory size $|C_t|$"


def test_settings_split_on_what_differs_but_not_on_bookkeeping(tmp_path):
    records = rl_records([0.5, 0.7], [3.0, 4.0])
    for job, (alpha, seed, log_interval) in enumerate(
        [(1e-6, 0, 1), (1e-6, 1, 5), (1e-5, 0, 1), (1e-5, 1, 1)]
    ):
        cfg = rl_config("expire_span", 64, seed, aux_loss_coef=alpha)
        cfg.update(log_interval=log_interval, wandb={"mode": "disabled", "project": f"p{job}"})
        make_run(tmp_path / "sweep" / str(job), cfg, records)
    make_run(tmp_path / "sweep" / "4", rl_config("transformer_xl", 64, 0), records)

    settings = summarize(
        label_settings([read_run(tmp_path / "sweep" / str(job)) for job in range(5)])
    )
    assert [(s.kind, s.setting, s.seeds) for s in settings] == [
        ("expire_span", "memory.aux_loss_coef=1e-05", [0, 1]),
        ("expire_span", "memory.aux_loss_coef=1e-06", [0, 1]),
        ("transformer_xl", "", [0]),
    ]
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out")]) == 0
    axes = plot_panel(settings).axes[0]
    notes = {text.get_text() for text in axes.texts}
    assert notes == {"aux_loss_coef=1e-05", "aux_loss_coef=1e-06"}
    expire = legend_line(axes, "Expire-Span")
    assert expire.get_linestyle() == "None"  # not a span sweep: no trade-off curve to draw
    assert len(expire.get_xydata()) == 2


def test_a_key_older_runs_lack_reads_as_its_default(tmp_path):
    """A run saved before configs/rl.yaml had `compile_learner` ran uncompiled: it is one
    setting with a newer run at `compile_learner: false`, and apart from one that compiled."""
    records = rl_records([0.5, 0.7], [3.0, 4.0])
    default = OmegaConf.load(ROOT / "configs" / "rl.yaml").compile_learner
    for job, extra in enumerate([{}, {"compile_learner": default}, {"compile_learner": "default"}]):
        make_run(tmp_path / str(job), rl_config("expire_span", 64, job) | extra, records)

    settings = summarize(label_settings([read_run(tmp_path / str(job)) for job in range(3)]))
    assert [(s.setting, s.seeds) for s in settings] == [
        ("compile_learner=False", [0, 1]),
        ("compile_learner=default", [2]),
    ]


@pytest.mark.slow
def test_a_popgym_sweep_is_grouped_by_task_and_memory_kind(tmp_path, capsys):
    """env=popgym runs differ in env.id: one figure and table per task, each setting a memory
    kind; the metric is MMER (the last value: it is a running maximum), the time the sum of
    the logged intervals."""
    tasks = ["RepeatPreviousEasy", "BattleshipEasy"]
    expected = {}
    job = 0
    for task in tasks:
        for kind, span in (("expire_span", 200), ("gru", None)):
            for seed in (0, 1):
                returns = [-0.5 + 0.1 * i + 0.05 * seed + 0.01 * job for i in range(8)]
                returns[5] = 0.9  # the best interval: MMER stays there
                records = [
                    {
                        "step": 6400 * (i + 1),
                        "return": r,
                        "mmer": max(returns[: i + 1]),
                        "memory_size": 10.0 * (span is not None) + 1 + seed,
                        "sps": 1000.0 + 100 * seed,
                    }
                    for i, r in enumerate(returns)
                ]
                cfg = rl_config(kind, 200, seed, env="popgym")  # (a GRU's config keeps a span)
                cfg["env"]["id"] = f"popgym:popgym-{task}-v0"
                make_run(tmp_path / "sweep" / str(job), cfg, records)
                minutes = 8 * 6400 / records[0]["sps"] / 60
                expected.setdefault((f"popgym-{task}-v0", kind), []).append(
                    (0.9, records[-1]["memory_size"], minutes)
                )
                job += 1

    out = tmp_path / "out"
    assert main([str(tmp_path / "sweep"), "--out", str(out), "--markdown"]) == 0
    rows = read_csv(out / "settings.csv")
    assert [(row["group"], row["kind"]) for row in rows] == sorted(
        expected, key=lambda key: (key[0], key[1] == "gru")
    )
    for row in rows:
        runs = expected[row["group"], row["kind"]]
        assert (row["metric"], row["runs"], row["seeds"]) == ("mmer", "2", "0 1")
        assert row["max_span"] == ("" if row["kind"] == "gru" else "200")  # a GRU has none
        assert float(row["final_mean"]) == pytest.approx(0.9)
        assert float(row["memory_size_mean"]) == pytest.approx(
            statistics.mean(m for _, m, _ in runs)
        )
        assert float(row["minutes_mean"]) == pytest.approx(statistics.mean(t for *_, t in runs))
        assert float(row["minutes_std"]) == pytest.approx(statistics.stdev(t for *_, t in runs))
    for task in tasks:
        assert imread(out / f"popgym-{task}-v0_mmer.png").shape[:2] == FIGURE_SHAPE
    assert imread(out / "overview.png").shape[:2] == (FIGURE_SHAPE[0], 2 * FIGURE_SHAPE[1])

    stdout = capsys.readouterr().out
    assert "popgym-BattleshipEasy-v0, mmer:" in stdout and "popgym-RepeatPreviousEasy-v0" in stdout
    header = "| memory | max span | runs | memory size | mmer | last return | held | steps |"
    assert header + " minutes |" in stdout
    minutes = statistics.mean(t for *_, t in expected["popgym-BattleshipEasy-v0", "gru"])
    # last returns 0.26 and 0.32 (jobs 6 and 7); neither held: both fall from 0.9 at the end
    row = f"| GRU |  | 2 | 1.5 ± 0.71 | 0.9 ± 0 | 0.29 ± 0.042 | 0/2 | 51,200 | {minutes:.3g} ± "
    assert row in stdout


@pytest.mark.parametrize(
    ("cfg", "logged", "metric", "last"),
    [
        (rl_config("expire_span", 100, 0, env="portal"), "rooms_reached", "rooms_reached", 5),
        (rl_config("expire_span", 100, 0, env="minigrid_memory"), "success", "success", 5),
        (
            {"task": {"name": "enwik8"}, "memory": {"kind": "expire_span"}, "seed": 0},
            "valid_bpb",
            "valid_bpb",
            1,
        ),
        (
            {"task": {"name": "copy"}, "memory": {"kind": "transformer_xl"}, "seed": 0},
            "valid_accuracy",
            "valid_accuracy",
            1,
        ),
        (
            {"task": {"name": "collision"}, "memory": {"kind": "expire_span"}, "seed": 0},
            "valid_error",
            "valid_error",
            1,
        ),
    ],
)
def test_metric_follows_the_env_or_task(tmp_path, cfg, logged, metric, last):
    records = [
        {"step": step, logged: 0.5 + step, "loss": 1.0, "memory_size": 3.0 + step}
        for step in range(10)
    ]
    make_run(tmp_path / "run", cfg, records)
    result = read_run(tmp_path / "run")
    assert result.metric == metric
    assert result.final == pytest.approx(0.5 + sum(range(10 - last, 10)) / last)
    assert result.memory_size == pytest.approx(3.0 + sum(range(10 - last, 10)) / last)
    assert read_run(tmp_path / "run", metric="loss", last=2).final == 1.0


def test_lm_validation_pairs_with_the_validation_memory_size(tmp_path):
    """train_lm.py logs memory_size while training and valid_memory_size with each validation
    pass; the figure pairs valid_bpb with the memory size of the same pass."""
    records = []
    for step in range(1, 9):
        record = {"step": 10 * step, "train_loss": 2.0, "memory_size": 100.0 + step}
        if step % 4 == 0:
            record.update(valid_bpb=2.0 - step / 10, valid_memory_size=50.0 + step)
        records.append(record)
    cfg = {"task": {"name": "enwik8"}, "memory": {"kind": "expire_span"}, "seed": 0}
    make_run(tmp_path / "run", {**cfg, "total_steps": 80}, records)
    result = read_run(tmp_path / "run")
    assert (result.final, result.memory_size, result.steps) == (pytest.approx(1.2), 58.0, 80)
    assert (result.last_return, result.held) == (None, None)
    assert "held" not in markdown_table(summarize([result]))
    assert read_run(tmp_path / "run", last=2).memory_size == pytest.approx(56.0)
    assert read_run(tmp_path / "run", metric="train_loss").memory_size == pytest.approx(106.0)


def test_a_finished_lm_run_reports_its_test_split_and_a_stopped_one_its_validation(tmp_path):
    """The paper reports the test split: a finished run's eval.json gives the final metric and
    the memory of that pass; a run without one (stopped) keeps its last validation pass, in a
    figure of its own; --metric still picks the validation series."""
    cfg = {"task": {"name": "instruction"}, "memory": {"kind": "expire_span", "block_len": 64}}
    cfg |= {"seed": 0, "batch_size": 16}
    records = [  # (1,024 tokens an update: 250 updates at 2,048 tokens/s, then 250 at 1,024)
        {"step": 250, "memory_size": 90.0, "valid_accuracy": 0.1, "valid_memory_size": 80.0},
        {"step": 500, "memory_size": 91.0, "valid_accuracy": 0.3, "valid_memory_size": 81.0},
    ]
    records[0]["tokens_per_s"], records[1]["tokens_per_s"] = 2048.0, 1024.0
    for name in ("finished", "stopped"):
        make_run(tmp_path / name, cfg, records)
    evaluation = {"test_accuracy": 0.25, "test_error": 0.75, "test_memory_size": 70.0, "step": 500}
    (tmp_path / "finished" / "eval.json").write_text(json.dumps({**evaluation, "seconds": 3.0}))
    finished, stopped = read_run(tmp_path / "finished"), read_run(tmp_path / "stopped")
    assert (finished.metric, finished.final, finished.memory_size) == ("test_accuracy", 0.25, 70.0)
    assert (stopped.metric, stopped.final, stopped.memory_size) == ("valid_accuracy", 0.3, 81.0)
    assert finished.steps == stopped.steps == 500
    assert finished.minutes == stopped.minutes == pytest.approx((125 + 250) / 60)
    assert read_run(tmp_path / "finished", metric="test_error").final == 0.75
    validation = read_run(tmp_path / "finished", metric="valid_accuracy")
    assert (validation.final, validation.memory_size) == (0.3, 81.0)
    (tmp_path / "finished" / "eval.json").write_text("{")
    with pytest.raises(PlotError, match="eval.json is not valid JSON"):
        read_run(tmp_path / "finished")


def test_a_single_run_directory_is_accepted_once(tmp_path):
    make_run(tmp_path / "run", rl_config("expire_span", 64, 7), rl_records([1.0], [5.0]))
    out = tmp_path / "out"
    assert main([str(tmp_path / "run"), str(tmp_path), "--out", str(out)]) == 0
    assert len(read_csv(out / "runs.csv")) == 1
    assert (out / "corridor_success.png").is_file()


def popgym_run(run_dir, seed, returns):
    """A POPGym run logging interval returns and MMER, their running maximum."""
    cfg = rl_config("gru", None, seed, env="popgym")
    cfg["env"]["id"] = "popgym:popgym-RepeatPreviousEasy-v0"
    records = [
        {"step": 1000 * (i + 1), "return": r, "mmer": max(returns[: i + 1]), "memory_size": 1.0}
        for i, r in enumerate(returns)
    ]
    make_run(run_dir, cfg, records)


@pytest.mark.parametrize(
    ("returns", "held"),
    [
        ([0.2, 0.5, 0.8, 0.7, 0.6], False),  # MMER stays at 0.8, the returns do not
        ([0.2, 0.5, 0.8, 0.75, 0.78], True),  # 0.05 below the best: held
        ([0.8, 0.6, 0.8], False),  # judged after the best's first occurrence
        ([0.795, 0.6, 0.8], False),  # and after its plateau's first interval, within 0.01
        ([0.5, 0.75, 0.78, 0.8], True),  # a run still rising holds
    ],
)
def test_mmer_runs_are_held_on_their_return_series(tmp_path, returns, held):
    popgym_run(tmp_path / "run", 0, returns)
    result = read_run(tmp_path / "run")
    assert (result.metric, result.final) == ("mmer", 0.8)
    assert (result.last_return, result.held) == (returns[-1], held)


def test_success_runs_are_held_on_their_success_series(tmp_path):
    records = [
        {"step": 1000 * (i + 1), "success": s, "return": r, "memory_size": 1.0}
        for i, (s, r) in enumerate([(0.2, 0.1), (0.9, 0.2), (0.7, 0.3)])
    ]
    make_run(tmp_path / "run", rl_config("expire_span", 64, 0), records)
    result = read_run(tmp_path / "run")
    assert result.metric == "success"
    assert (result.last_return, result.held) == (0.3, False)  # the returns alone would hold


def test_csvs_give_last_return_and_how_many_seeds_held(tmp_path, capsys):
    popgym_run(tmp_path / "sweep" / "0", 0, [0.2, 0.5, 0.8, 0.7, 0.6])
    popgym_run(tmp_path / "sweep" / "1", 1, [0.2, 0.5, 0.8, 0.75, 0.78])
    out = tmp_path / "out"
    assert main([str(tmp_path / "sweep"), "--out", str(out), "--markdown"]) == 0
    runs = read_csv(out / "runs.csv")
    assert [(row["last_return"], row["held"]) for row in runs] == [
        ("0.6", "False"),
        ("0.78", "True"),
    ]
    (row,) = read_csv(out / "settings.csv")
    assert float(row["last_return_mean"]) == pytest.approx(0.69)
    assert float(row["last_return_std"]) == pytest.approx(statistics.stdev([0.6, 0.78]))
    assert row["held"] == "1/2"
    assert "| 0.8 ± 0 | 0.69 ± 0.13 | 1/2 | 5,000 |" in capsys.readouterr().out


def test_a_suite_gets_a_table_of_every_task_by_memory_setting(tmp_path, capsys):
    """--markdown over several tasks adds one table: a row per task, a column per memory
    setting (mean ± spread to the decimal that shows it), then memory sizes and held runs."""
    for job, (task, kind, seed, returns) in enumerate(
        [
            ("RepeatFirstEasy", "expire_span", 0, [0.2, 0.99995]),
            ("RepeatFirstEasy", "expire_span", 1, [0.2, 0.99997]),
            ("RepeatFirstEasy", "gru", 0, [0.2, 0.9, 0.7]),
            ("CountRecallEasy", "gru", 0, [-0.5, 1 / 3]),
            ("CountRecallEasy", "gru", 1, [-0.5, 1 / 3 + 1e-12]),  # a spread that is rounding
        ]
    ):
        cfg = rl_config(kind, 200 if kind == "expire_span" else None, seed, env="popgym")
        cfg["env"]["id"] = f"popgym:popgym-{task}-v0"
        records = [
            {"step": 1000 * (i + 1), "return": r, "mmer": max(returns[: i + 1])}
            | {"memory_size": 5.0 + seed if kind == "expire_span" else 1.0}
            for i, r in enumerate(returns)
        ]
        make_run(tmp_path / "sweep" / str(job), cfg, records)
    assert main([str(tmp_path / "sweep"), "--out", str(tmp_path / "out"), "--markdown"]) == 0
    table = capsys.readouterr().out.split("Every task:\n\n")[1].splitlines()
    assert table[0] == (
        "| task | Expire-Span 200 | GRU | memory size: Expire-Span 200, GRU "
        "| held: Expire-Span 200, GRU |"
    )
    assert table[2:] == [
        "| popgym-CountRecallEasy-v0 (mmer) |  | 0.333 ± 0.000 | -, 1 | -, 2/2 |",
        "| popgym-RepeatFirstEasy-v0 (mmer) | 0.99996 ± 0.00001 | 0.900 | 5.5, 1 | 2/2, 0/1 |",
    ]


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


@pytest.mark.slow
def test_command_line_error_has_no_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "analysis.plot", str(tmp_path / "nope"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr == f"python -m analysis.plot: error: {tmp_path / 'nope'} does not exist\n"


# A real sweep: train_rl.py -m with two memory kinds, tiny enough to take seconds.
TINY_STEPS = 280  # 7 updates of 4 x 10 steps: more log lines than FINAL_POINTS


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory):
    sweep = tmp_path_factory.mktemp("real") / "sweep"
    result = subprocess.run(
        [sys.executable, str(ROOT / "train_rl.py"), "-m", "memory=expire_span,transformer_xl"]
        + [*TINY_RL, f"total_steps={TINY_STEPS}", f"hydra.sweep.dir={sweep}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert result.returncode == 0, result.stderr
    return sweep


def expected_from_files(run_dir):
    """kind, success and memory size recomputed from the run's own files."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    kind = OmegaConf.load(run_dir / "config.yaml").memory.kind
    success = final([r["success"] for r in records])
    return kind, success, final([r["memory_size"] for r in records]), records[-1]["step"]


@pytest.mark.xdist_group("real_sweep")  # (its module-scoped fixture)
@pytest.mark.slow
def test_real_sweep_points_and_csv_match_the_metrics_files(real_sweep, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([str(real_sweep), "--out", str(out), "--markdown"]) == 0
    stdout = capsys.readouterr().out

    rows = read_csv(out / "runs.csv")
    assert [row["run_dir"] for row in rows] == [str(real_sweep / job) for job in ("0", "1")]
    expected = [expected_from_files(real_sweep / job) for job in ("0", "1")]
    assert [kind for kind, *_ in expected] == ["expire_span", "transformer_xl"]
    for row, (kind, success, memory_size, steps) in zip(rows, expected, strict=True):
        assert (row["kind"], row["max_span"], row["seed"]) == (kind, "16", "0")
        assert float(row["final"]) == pytest.approx(success)
        assert float(row["memory_size"]) == pytest.approx(memory_size)
        assert int(row["steps"]) == steps == TINY_STEPS
        assert 0 < float(row["memory_size"]) <= 16

    assert imread(out / "corridor_success.png").shape[:2] == FIGURE_SHAPE
    settings = summarize(label_settings([read_run(real_sweep / job) for job in ("0", "1")]))
    axes = plot_panel(settings).axes[0]
    for kind, success, memory_size, _ in expected:
        np.testing.assert_allclose(run_points(axes, kind), [(memory_size, success)])

    table = stdout.splitlines()
    assert table[:4] == [
        "corridor, success:",
        "",
        "| memory | max span | runs | memory size | success | last return | held | steps"
        " | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    (_, success, memory_size, _) = expected[0]
    cells = [cell.strip() for cell in table[4].strip("|").split("|")]
    assert cells[:3] == ["Expire-Span", "16", "1"] and cells[7] == "280" and float(cells[8]) > 0
    assert cells[6] == {"True": "1/1", "False": "0/1"}[rows[0]["held"]]
    # three significant digits (compared as numbers: the last digit may round either way)
    for cell, value in zip(cells[3:5], (memory_size, success), strict=True):
        assert len(cell.replace(".", "").lstrip("0")) <= 3
        assert float(cell) == pytest.approx(value, rel=5e-3)
    assert table[5].startswith("| Transformer-XL | 16 | 1 |")


@pytest.mark.xdist_group("real_sweep")  # (its module-scoped fixture)
@pytest.mark.slow
def test_real_sweep_with_runs_not_done_yet(real_sweep, tmp_path, capsys):
    sweep = tmp_path / "sweep"
    shutil.copytree(real_sweep, sweep)
    metrics = sweep / "1" / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:3]) + lines[3][:20])  # a line being written
    out = tmp_path / "out"
    assert main([str(sweep), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "1 run(s) still running or stopped early" in err
    assert f"{sweep / '1'}: step 120 of {TINY_STEPS}" in err
    assert read_csv(out / "runs.csv")[1]["steps"] == "120"

    (sweep / "0" / "metrics.jsonl").unlink()
    metrics.write_text("")
    assert main([str(sweep), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{sweep / '0'}: no metrics.jsonl yet" in err
    assert f"{sweep / '1'}: metrics.jsonl is empty" in err
    assert "error: no run has usable metrics yet" in err


def test_holding_judges_the_run_after_it_first_reaches_the_target():
    from analysis.curves import holding

    def records(values):
        return [
            {"step": 1000 * (i + 1), "success": v, "memory_size": 10.0 + i}
            for i, v in enumerate(values)
        ]

    held = holding(records([0.5, 0.97, None, 0.93, 0.99]), "success", 0.95, 0.9)
    assert held.reached_at == 2000 and held.holds
    assert held.lowest_after == 0.93
    assert held.mean_after == pytest.approx((0.97 + 0.93 + 0.99) / 3)
    # the interval without a value (step 3000) is skipped
    assert held.memory_after == pytest.approx((11 + 13 + 14) / 3)
    dipped = holding(records([0.96, 0.99, 0.85, 0.99]), "success", 0.95, 0.9)
    assert dipped.lowest_after == 0.85 and not dipped.holds  # a peak that does not last
    low_mean = holding(records([0.95, 0.91, 0.92]), "success", 0.95, 0.9)
    assert low_mean.lowest_after >= 0.9 and not low_mean.holds
    assert holding(records([0.97, 0.99]), "success", 0.95, 0.9, max_memory=10.5).holds
    large = holding(records([0.97, 0.99]), "success", 0.95, 0.9, max_memory=10.4)
    assert large.memory_after == 10.5 and not large.holds  # memory sizes 10 and 11
    never = holding(records([0.5, 0.6]), "success", 0.95, 0.9)
    assert never.reached_at is None and not never.holds and never.best == 0.6
    assert dipped.best == 0.99


def test_curves_table_and_figure_from_run_directories(tmp_path, capsys):
    from analysis import curves

    held = rl_records([0.5, 0.96, 0.97, 0.99], [30.0, 20.0, 18.0, 16.0])
    lost = rl_records([0.6, 0.97, 0.55, 0.6], [40.0, 25.0, 16.0, 16.0])
    for record in held:
        record.update({"span/l0_mean": 5.0, "span/l1_mean": 9.0})
    make_run(tmp_path / "a", rl_config("expire_span", 200, 0), held)
    make_run(tmp_path / "b", rl_config("transformer_xl", 50, 1), lost)
    evaluation = {"greedy": {"success": 0.987, "memory_size": 12.34}, "sampled": {"success": 1.0}}
    (tmp_path / "a" / "eval.json").write_text(json.dumps(evaluation))
    (tmp_path / "b" / "eval.json").write_text(json.dumps({"success": 0.5, "memory_size": 4.0}))
    figure = tmp_path / "curves.png"
    assert (
        curves.main([str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(figure), "--markdown"])
        == 0
    )
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert rows[0].split(" | ")[:4] == ["| Expire-Span", "0", "0.00M", "2k"]
    assert rows[0].endswith("| 18.0 | yes | 0.99 greedy, 1.00 sampled | 12.3 |")  # (eval.json)
    assert rows[1].startswith("| Transformer-XL L=50 | 1 |")  # an eval.json of one policy:
    assert rows[1].endswith("| no | 0.50 greedy | 4.0 |")  # the config's eval.greedy (unset)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    evaluation["greedy"].update(truncated=0.013, length_ratio=1.0049, blocked_likely=0.002)
    evaluation["sampled"].update(truncated=0.0, length_ratio=1.02)
    (tmp_path / "a" / "eval.json").write_text(json.dumps(evaluation))
    runs = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert curves.main([*runs, "--markdown", "--acting"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ")][1:]
    assert rows[0].endswith(
        "| yes | 0.987 / 1.000 | 0.013 / 0.000 | 1.005 / 1.020 | 0.002 | 12.3 |"
    )
    assert rows[1].endswith("| no | - | - | - | - | - |")  # no evaluation of both policies
    assert out.rstrip().endswith("median first >= 0.95: 2k over 2 of 2 runs")


@pytest.mark.slow
def test_curves_refuses_a_language_model_run_in_one_line(tmp_path):
    """A train_lm.py run has no env: curves says so and names the tools for it."""
    lm_config = {"task": {"name": "copy"}, "memory": {"kind": "expire_span"}, "seed": 0}
    make_run(tmp_path / "lm", lm_config, [{"step": 10, "valid_accuracy": 0.5, "memory_size": 4.0}])
    result = subprocess.run(
        [sys.executable, "-m", "analysis.curves", str(tmp_path / "lm")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"python -m analysis.curves: error: {tmp_path / 'lm'} is a language")
    assert "train_lm.py (task=copy)" in line and "RL runs of train_rl.py" in line
    assert "analysis.visualize" in line


def test_a_sweeps_probes_are_averaged_per_setting(tmp_path, capsys):
    """`analysis.probes` reads each run's saved probe, groups the runs as `analysis.plot` does
    and averages each group's score over a setting's probed runs (an empty group left out),
    with a group's count in the header where every run has the same; runs without the file are
    named, and a sweep without any is refused."""

    def probe(accuracy, sender, far):
        return {
            "split": "test",
            "accuracy": accuracy,
            "count": 10,
            "parts": {"sender": {"accuracy": sender, "count": 10}},
            "by_distance": {"128-255": {"accuracy": far, "count": 4 if far is not None else 0}},
        }

    probes = {
        ("expire_span", 1024, 0): probe(0.2, 0.4, 0.5),
        ("expire_span", 1024, 1): probe(0.4, 0.6, None),
        ("transformer_xl", 256, 0): probe(0.1, 0.3, 0.25),
        ("transformer_xl", 256, 1): None,
    }
    for (kind, span, seed), saved in probes.items():
        run_dir = tmp_path / f"{kind}-{seed}"
        cfg = {"task": {"name": "instruction"}, "memory": {"kind": kind, "max_span": span}}
        make_run(run_dir, {**cfg, "seed": seed}, [{"step": 10, "valid_accuracy": 0.1}])
        if saved is not None:
            (run_dir / "probe.json").write_text(json.dumps(saved))
    assert probes_main([str(tmp_path), "--file", "probe.json"]) == 0
    out, err = capsys.readouterr()
    header, _, expire_span, transformer_xl = out.strip().splitlines()
    assert header == (
        "| memory | max span | probed runs | all (accuracy, 10) | sender (accuracy, 10) "
        "| 128-255 (accuracy) |"
    )
    assert expire_span == "| Expire-Span | 1024 | 2 | 0.300 | 0.500 | 0.500 |"
    assert transformer_xl == "| Transformer-XL | 256 | 1 | 0.100 | 0.300 | 0.250 |"
    assert "1 run(s) without probe.json" in err and "transformer_xl-1" in err
    collision = {"all": {"error": 0.5, "count": 4}, "?last": {"error": None, "count": 0}}
    collision |= {"split": "test", "references": {"constant_error": 0.7}}
    assert probe_groups(collision) == {"all": ("error", 0.5, 4), "?last": ("error", None, 0)}
    assert probes_main([str(tmp_path), "--file", "other.json"]) == 2
    assert "no run has a other.json" in capsys.readouterr().err
    (tmp_path / "expire_span-0" / "probe.json").write_text('{"accuracy": 0.2}')
    assert probes_main([str(tmp_path), "--file", "probe.json"]) == 2
    assert "expire_span-0/probe.json is not a probe's JSON" in capsys.readouterr().err
