"""Tests for the training package: config checks, checkpoints, metrics, W&B, DDP, progress."""

from __future__ import annotations

import copy
import errno
import io
import json
import math
import os
import platform
import random
import re
import socket
import subprocess
import sys
import textwrap
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from hydra import initialize_config_dir
from omegaconf import OmegaConf

import training.host
import training.progress
from scripts import claimed_by_another_process
from training.checkpoint import check_checkpoint_kind, load_checkpoint, save_checkpoint
from training.config import (
    ConfigError,
    check_choice,
    check_positive,
    check_positive_int,
    check_range,
    check_whole,
    check_writable,
    exit_on_config_error,
    refuse_added_keys,
)
from training.distributed import DistInfo, all_reduce_mean, resolve_device, setup_distributed
from training.extras import EXTRAS, LAUNCHERS, require, require_launcher
from training.files import DiskFullError, atomic_open
from training.host import GPU_FILLING_ENVS, describe_device, thread_count
from training.metrics import MetricsLogger, SpanStats, check_wandb_config, read_metrics
from training.progress import progress_bar, set_metrics
from training.resume import check_run_dir_argument, given_keys, resume_checkpoint
from training.run import start_run
from training.run_dir import claim_run_dir, get_run_dir, refuse_claimed, save_resolved_config
from training.seeding import restore_rng_state, rng_state, seed_everything

NO_WANDB = {"wandb": {"mode": "disabled"}}

# --- config validation ---------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_check_choice_names_the_valid_choices():
    with pytest.raises(ConfigError) as error:
        check_choice("env", "corridr", ["corridor", "minigrid_memory", "portal"])
    assert str(error.value).startswith(
        "env=corridr is not a known env; choose one of: corridor, minigrid_memory, portal"
    )
    assert "did you mean corridor?" in str(error.value)
    check_choice("env", "portal", ["corridor", "portal"])


@pytest.mark.parametrize(
    ("check", "args", "message"),
    [
        (check_positive, ("optim.lr", -0.1), "optim.lr=-0.1 must be > 0"),
        (check_positive, ("optim.lr", 0), "optim.lr=0 must be > 0"),
        (check_positive, ("optim.lr", "fast"), "optim.lr=fast must be a number > 0"),
        (check_positive_int, ("num_envs", 2.5), "num_envs=2.5 must be a whole number > 0"),
        (check_positive_int, ("num_envs", 0), "num_envs=0 must be >= 1"),
        (check_whole, ("checkpoint_keep", 0), None),
        (check_whole, ("checkpoint_keep", -1), "checkpoint_keep=-1 must be >= 0"),
        (
            check_whole,
            ("checkpoint_keep", True),
            "checkpoint_keep=True must be a whole number >= 0",
        ),
        (check_range, ("gamma", 1.5, 0, 1), "gamma=1.5 must be in [0, 1]"),
        (check_range, ("gamma", float("nan"), 0, 1), "gamma=nan must be a number in [0, 1]"),
        (check_range, ("p", 1.0, 0, 1), None),
        (check_range, ("p", 0.0, 0, 1), None),
    ],
)
def test_numeric_checks(check, args, message):
    if message is None:
        check(*args)
        return
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check(*args)


def test_check_range_open_bounds():
    check_range("gamma", 0.5, 0, 1, low_open=True, high_open=True)
    with pytest.raises(ConfigError, match=r"gamma=0 must be in \(0, 1\]"):
        check_range("gamma", 0, 0, 1, low_open=True)
    with pytest.raises(ConfigError, match=r"must be < 1"):
        check_range("dropout", 1, high=1, high_open=True)


def test_check_writable_takes_a_new_or_existing_file_and_refuses_what_cannot_hold_one(tmp_path):
    """A file to write may be new (under a directory that exists or will) or one to replace;
    a directory, a path under a file, or a run directory that is a file is refused."""
    existing = tmp_path / "episode.gif"
    existing.write_bytes(b"GIF89a")
    for path in (existing, tmp_path / "new.gif", tmp_path / "new" / "deeper" / "episode.gif"):
        check_writable("eval.record", path)
    check_writable("hydra.run.dir", tmp_path / "run", directory=True)
    with pytest.raises(ConfigError, match="is a directory; give a file name"):
        check_writable("eval.record", tmp_path)
    with pytest.raises(ConfigError, match=f"{existing} is not a directory"):
        check_writable("eval.record", existing / "episode.gif")
    with pytest.raises(ConfigError, match=f"{existing} is not a directory"):
        check_writable("hydra.run.dir", existing, directory=True)


def test_a_key_that_plus_adds_is_refused_unless_its_mapping_is_open(tmp_path):
    """`+KEY=VALUE` for a key the config lacks is a misspelling nothing would read; a config
    group (`+sweep=...`) and a key under an open mapping (an env's keyword arguments) are
    not."""
    (tmp_path / "sweep").mkdir()
    cfg = OmegaConf.create({"agent": {"lr": 1e-3, "gamma": 0.99}, "env": {"kwargs": {}}})
    cfg.agent.lrr, cfg.env.kwargs.size = 1, 9  # as Hydra composed them
    refuse_added_keys(
        ["+sweep=suite", "+env.kwargs.size=9", "agent.lr=2"], cfg, tmp_path, ["env.kwargs"]
    )
    with pytest.raises(
        ConfigError, match=r"^\+agent.lrr: agent has no setting lrr.*did you mean agent.lr\?$"
    ):
        refuse_added_keys(["+agent.lrr=1"], cfg, tmp_path, ["env.kwargs"])
    with pytest.raises(ConfigError, match="the config has no setting seeed"):
        refuse_added_keys(["+seeed=1"], OmegaConf.create({"seeed": 1}), tmp_path)


def test_exit_on_config_error_prints_one_line_and_exits_2(capsys):
    @exit_on_config_error
    def main(kind):
        check_choice("memory.kind", kind, ["expire_span", "transformer_xl"])
        return "trained"

    assert main("expire_span") == "trained"
    with pytest.raises(SystemExit) as exit_info:
        main("xl")
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "Config error: memory.kind=xl is not a known kind; "
        "choose one of: expire_span, transformer_xl\n"
    )


@pytest.mark.slow
def test_hydra_entry_point_exits_2_without_traceback_before_any_work(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "config.yaml").write_text("wandb:\n  mode: offline\nsteps: 10\n")
    (tmp_path / "app.py").write_text(
        textwrap.dedent(
            """
            import hydra
            from training.config import exit_on_config_error
            from training.metrics import check_wandb_config
            from training.run_dir import get_run_dir

            @hydra.main(version_base=None, config_path="conf", config_name="config")
            @exit_on_config_error
            def main(cfg):
                check_wandb_config(cfg.wandb)
                (get_run_dir() / "work_started").touch()

            main()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "app.py", "wandb.mode=onlin", "hydra.run.dir=run"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        "Config error: wandb.mode=onlin is not a known mode; "
        "choose one of: disabled, offline, online (did you mean online?)\n"
    )
    assert not (tmp_path / "run" / "work_started").exists()


def test_check_wandb_config_fills_defaults_and_rejects_unknown_keys():
    assert check_wandb_config(None)["mode"] == "offline"
    assert check_wandb_config({"mode": "disabled", "tags": ["a"]})["tags"] == ["a"]
    with pytest.raises(ConfigError, match="unknown wandb option.*projet"):
        check_wandb_config({"projet": "x"})
    with pytest.raises(ConfigError, match="wandb.tags=a must be a list"):
        check_wandb_config({"tags": "a"})


# --- atomic files and checkpoints -------------------------------------------------------


def test_atomic_open_removes_what_killed_writers_left(tmp_path):
    path = tmp_path / "checkpoint.pt"
    dead = tmp_path / ".checkpoint.pt.99999999999.tmp"  # no such process
    alive = tmp_path / f".checkpoint.pt.{os.getppid()}.tmp"  # a writer still at work
    other = tmp_path / ".metrics.jsonl.99999999999.tmp"  # another file's
    for leftover in (dead, alive, other):
        leftover.write_bytes(b"half a checkpoint")
    with atomic_open(path, "wb") as file:
        file.write(b"whole")
    assert path.read_bytes() == b"whole"
    assert not dead.exists() and alive.exists() and other.exists()


def test_checkpoint_snapshots_left_half_written_by_killed_writers_are_removed(tmp_path):
    """A snapshot name is written once, so its leftovers are removed by any later snapshot."""
    dead = tmp_path / ".checkpoint_40.pt.99999999999.tmp"
    alive = tmp_path / f".checkpoint_40.pt.{os.getppid()}.tmp"
    for leftover in (dead, alive):
        leftover.write_bytes(b"half a checkpoint")
    save_checkpoint(tmp_path, {"step": 80}, keep_last=2)
    assert (tmp_path / "checkpoint_80.pt").exists()
    assert not dead.exists() and alive.exists()


def test_atomic_open_keeps_old_content_when_the_write_fails(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_open(path) as file:
        file.write("new, but not fin")
        raise RuntimeError("killed")
    assert path.read_text() == "old\n"
    assert os.listdir(tmp_path) == ["config.yaml"]


def test_save_checkpoint_failing_midway_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    save_checkpoint(tmp_path, {"weights": torch.arange(4.0), "step": 100})
    real_save = torch.save

    def save_half_then_die(obj, file, *args, **kwargs):
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        file.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", save_half_then_die)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, {"weights": torch.zeros(4), "step": 200})
    monkeypatch.undo()

    checkpoint = load_checkpoint(tmp_path)
    assert checkpoint["step"] == 100
    assert torch.equal(checkpoint["weights"], torch.arange(4.0))
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]


def test_keep_last_keeps_the_newest_step_snapshots(tmp_path):
    for step in (10, 20, 30, 40, 100):
        save_checkpoint(tmp_path, {"value": step, "step": step}, keep_last=2)
    assert sorted(os.listdir(tmp_path)) == [
        "checkpoint.pt",
        "checkpoint_100.pt",
        "checkpoint_40.pt",
    ]
    assert load_checkpoint(tmp_path)["value"] == 100
    assert load_checkpoint(tmp_path / "checkpoint_40.pt") == {"value": 40, "step": 40}


def test_save_checkpoint_needs_an_integer_step(tmp_path):
    with pytest.raises(ValueError, match='needs an integer "step"'):
        save_checkpoint(tmp_path, {"model": {}})


def test_load_checkpoint_takes_a_run_dir_or_a_file_and_gives_none_when_absent(tmp_path):
    assert load_checkpoint(tmp_path) is None
    assert load_checkpoint(tmp_path / "checkpoint_5.pt") is None
    save_checkpoint(tmp_path, {"step": 5}, keep_last=1)
    assert load_checkpoint(tmp_path) == {"step": 5}
    assert load_checkpoint(tmp_path / "checkpoint_5.pt") == {"step": 5}


def test_the_keys_a_command_gives_include_those_of_the_files_it_adds():
    """+sweep=suite gives the sweep file's settings (its hydra block aside); memory=gru the
    group's; a plain override its own key."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        given = given_keys(["+sweep=suite", "seed=3", "wandb.mode=disabled"], "rl")
        assert {"total_steps", "log_interval", "resume", "seed", "wandb.mode"} <= set(given)
        assert not [key for key in given if key.startswith("hydra")]
        assert "memory.kind" in given_keys(["memory=gru"], "rl")
        assert given_keys(["log_interval=3"], "rl") == ["log_interval"]


def test_resume_without_a_checkpoint_names_the_directory_looked_at(tmp_path):
    assert resume_checkpoint(tmp_path, resume=False) is None
    with pytest.raises(ConfigError) as error:
        resume_checkpoint(tmp_path, resume=True)
    assert f"resume=true but there is no checkpoint.pt in {tmp_path.resolve()}" in str(error.value)
    save_checkpoint(tmp_path, {"step": 3})
    assert resume_checkpoint(tmp_path, resume=True)["step"] == 3


def test_an_unreadable_checkpoint_is_a_config_error(tmp_path):
    save_checkpoint(tmp_path, {"step": 3, "weights": torch.zeros(1000)})
    whole = (tmp_path / "checkpoint.pt").read_bytes()
    (tmp_path / "checkpoint.pt").write_bytes(whole[: len(whole) // 2])
    (tmp_path / "notes.txt").write_text("hello")
    for path in (tmp_path, tmp_path / "notes.txt"):
        with pytest.raises(ConfigError, match="cannot be read as a checkpoint"):
            load_checkpoint(path)
    with pytest.raises(ConfigError, match="cannot be read as a checkpoint"):
        resume_checkpoint(tmp_path, resume=True)


def test_a_checkpoint_of_the_other_trainer_is_a_config_error():
    check_checkpoint_kind({"agent": {}}, "agent", "best.pt", other="train_lm.py")
    with pytest.raises(ConfigError, match=r"holds no 'model'.*use train_rl.py"):
        check_checkpoint_kind({"agent": {}}, "model", "best.pt", other="train_rl.py")


@pytest.mark.parametrize("written", ["checkpoint.pt", "metrics.jsonl"])
def test_a_new_run_never_overwrites_a_run_directory(tmp_path, written):
    (tmp_path / written).write_bytes(b"an earlier run's")
    with pytest.raises(ConfigError, match=rf"already holds a run \({written}\).*resume=true"):
        resume_checkpoint(tmp_path, resume=False)
    assert (tmp_path / written).read_bytes() == b"an earlier run's"


def test_overwrite_deletes_the_earlier_run_and_nothing_else(tmp_path):
    run_files = ("checkpoint.pt", "best.pt", "checkpoint_40.pt", "metrics.jsonl")
    for name in (*run_files, "notes.txt"):
        (tmp_path / name).write_bytes(b"an earlier run's")
    assert resume_checkpoint(tmp_path, resume=False, overwrite=True) is None
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]
    with pytest.raises(ConfigError, match="pick one"):
        resume_checkpoint(tmp_path, resume=True, overwrite=True)


def test_a_run_dir_argument_that_cannot_hold_a_run_is_refused_before_hydra(tmp_path):
    """hydra.run.dir=PATH is checked before Hydra creates it: under a file, or aimed at an
    earlier run without resume=true, it is a config error; a new run, one that overwrites
    the earlier run, or resume=auto (given or from a config file) is not."""

    def check(*args):
        configs = Path(__file__).parents[1] / "configs"
        check_run_dir_argument(list(args), configs, "rl", check=lambda cfg: None)

    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match="a_file is not a directory"):
        check("seed=1", f"hydra.run.dir={tmp_path / 'a_file' / 'run'}")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="already holds a run"):
        check(f"hydra.run.dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match="resume=true but there is no checkpoint.pt"):
        check(f"hydra.run.dir={tmp_path / 'run'}", "resume=true")
    check(f"hydra.run.dir={tmp_path / 'run'}", "overwrite=true")
    check(f"hydra.run.dir={tmp_path / 'run'}", "resume=auto")
    check(f"hydra.run.dir={tmp_path / 'run'}", "+sweep=suite")  # its config sets resume=auto
    check(f"hydra.run.dir={tmp_path / 'new' / 'run'}")
    check("hydra.run.dir=outputs/${now:%H-%M-%S}")  # Hydra makes it


def test_model_and_optimizer_round_trip_through_a_weights_only_checkpoint(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    save_checkpoint(
        tmp_path,
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 7},
    )
    checkpoint = load_checkpoint(tmp_path)
    restored = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    restored.load_state_dict(checkpoint["model"])
    for original, loaded in zip(model.parameters(), restored.parameters(), strict=True):
        assert torch.equal(original, loaded)
    torch.optim.Adam(restored.parameters(), lr=1e-3).load_state_dict(checkpoint["optimizer"])


@pytest.mark.parametrize(
    ("bad", "type_name"),
    [
        (np.float64(0.5), "numpy.float64"),
        (np.zeros(3), "numpy.ndarray"),
        (OmegaConf.create({"lr": 1}), "omegaconf.dictconfig.DictConfig"),
    ],
)
def test_save_checkpoint_rejects_what_weights_only_loading_cannot_read(tmp_path, bad, type_name):
    with pytest.raises(TypeError, match=rf"state\['stats'\]\[1\] has type {type_name}"):
        save_checkpoint(tmp_path, {"stats": [1.0, bad], "step": 1})
    assert not (tmp_path / "checkpoint.pt").exists()


def test_rng_state_restored_from_a_checkpoint_repeats_the_same_draws(tmp_path):
    seed_everything(123)
    save_checkpoint(tmp_path, {"rng": rng_state(), "step": 1})
    first = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3).tolist())
    restore_rng_state(load_checkpoint(tmp_path)["rng"])
    again = (random.random(), np.random.rand(), np.random.randn(), torch.rand(3).tolist())
    assert first == again


# --- run directory and metrics ----------------------------------------------------------


def test_save_resolved_config_resolves_interpolations(tmp_path):
    cfg = OmegaConf.create({"memory": {"max_span": 200}, "agent": {"span": "${memory.max_span}"}})
    save_resolved_config(tmp_path, cfg)
    assert "${" not in (tmp_path / "config.yaml").read_text()
    assert OmegaConf.load(tmp_path / "config.yaml").agent.span == 200


def test_run_dir_is_the_working_directory_outside_hydra(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert get_run_dir() == tmp_path


def test_metrics_lines_are_plain_json_with_step(tmp_path):
    with MetricsLogger(tmp_path, NO_WANDB) as logger:
        logger.log({"return": torch.tensor(0.25), "success": np.float32(1.0), "done": True}, 10)
        logger.log({"loss": float("nan"), "episodes": np.int64(3)}, step=20)
        with pytest.raises(TypeError, match="metric 'note' is 'hi'"):
            logger.log({"note": "hi"}, step=30)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert lines == [
        '{"step": 10, "return": 0.25, "success": 1.0, "done": 1}',
        '{"step": 20, "loss": null, "episodes": 3}',
    ]


def test_resume_keeps_exactly_the_lines_up_to_the_checkpoint_step(tmp_path):
    with MetricsLogger(tmp_path, NO_WANDB) as logger:
        for step in range(100, 1100, 100):
            logger.log({"return": step / 1000}, step=step)
    with open(tmp_path / "metrics.jsonl", "a") as file:
        file.write('{"step": 1100, "ret')  # a line cut off when the run was killed

    with MetricsLogger(tmp_path, NO_WANDB, resume_step=600) as logger:
        assert [record["step"] for record in read_metrics(logger.path)] == [
            100,
            200,
            300,
            400,
            500,
            600,
        ]
        logger.log({"return": 0.7}, step=700)
    steps = [record["step"] for record in read_metrics(tmp_path / "metrics.jsonl")]
    assert steps == [100, 200, 300, 400, 500, 600, 700]

    with MetricsLogger(tmp_path, NO_WANDB) as logger:
        logger.log({"return": 0.0}, step=1)
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "return": 0.0}]


def test_disabled_logger_on_other_ranks_writes_nothing(tmp_path):
    logger = MetricsLogger(tmp_path, {"wandb": {"mode": "offline"}}, enabled=False)
    logger.log({"return": 1.0}, step=1)
    logger.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_wandb_offline_run_writes_under_the_run_dir_without_network(tmp_path, monkeypatch, capfd):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # any network use would fail
    sent = []
    real_log = wandb.Run.log

    def spy_log(run, data, *args, **kwargs):
        sent.append(dict(data))
        return real_log(run, data, *args, **kwargs)

    monkeypatch.setattr(wandb.Run, "log", spy_log)
    cfg = OmegaConf.create({"seed": 1, "span": "${seed}", "wandb": {"mode": "offline"}})
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"first_metric": 0.5}, step=10)
        logger.log({"first_metric": 0.25}, step=20)
    run_id = (tmp_path / "wandb_run_id").read_text().strip()
    with MetricsLogger(tmp_path, cfg, resume_step=10) as logger:
        logger.log({"resumed_metric": 0.75}, step=20)

    assert sent == [
        {"step": 10, "first_metric": 0.5},
        {"step": 20, "first_metric": 0.25},
        {"step": 20, "resumed_metric": 0.75},
    ]
    assert (tmp_path / "wandb_run_id").read_text().strip() == run_id
    # (a resumed run that starts within the same second gets the directory name suffix "-1";
    # W&B's service may still be writing its log when finish() returns, so allow it a moment)
    pattern = f"offline-run-*-{run_id}*/run-{run_id}.wandb"
    deadline = time.monotonic() + 30
    while True:
        written = b"".join(p.read_bytes() for p in (tmp_path / "wandb").glob(pattern))
        if b"first_metric" in written and b"resumed_metric" in written:
            break
        assert time.monotonic() < deadline, f"the offline run files hold no metrics: {written!r}"
        time.sleep(0.2)
    captured = capfd.readouterr()
    assert "wandb:" not in captured.out + captured.err
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [10, 20]


# --- devices and torchrun ---------------------------------------------------------------


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ConfigError, match="device=gpu is not a known device; choose one of"):
        resolve_device("gpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="device=cuda:1 but this PyTorch sees no CUDA GPU"):
            resolve_device("cuda:1")


def test_single_process_without_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    dist = setup_distributed("cpu")
    assert dist == DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    assert dist.is_main and not dist.is_distributed
    assert all_reduce_mean({"return": 0.5, "loss": math.nan}, dist)["return"] == 0.5


def test_a_rank_without_a_gpu_of_its_own_is_refused_in_one_line(monkeypatch):
    """torchrun --nproc_per_node=2 on a machine with one GPU: rank 1 would ask for cuda:1."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match="only 1 CUDA device") as error:
        setup_distributed("auto")
    assert "--nproc_per_node" in str(error.value) and "\n" not in str(error.value)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _distributed_worker(rank: int, port: int, out_dir: str) -> None:
    from training.distributed import all_gather_object, cleanup_distributed

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    os.chdir(os.path.join(out_dir, f"cwd{rank}"))
    dist = setup_distributed("cpu")
    metrics = {"loss": 1.0 + 2.0 * rank, "return": math.nan if rank == 1 else 0.25}
    metrics["none"] = math.nan
    result = {
        "rank": dist.rank,
        "world_size": dist.world_size,
        "is_main": dist.is_main,
        "mean": all_reduce_mean(metrics, dist),
        "gathered": all_gather_object(f"state of {rank}", dist),
        "run_dir": str(get_run_dir(dist)),
    }
    cleanup_distributed()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as file:
        json.dump(result, file)


@pytest.mark.slow
def test_two_process_gloo_setup_and_metric_mean(tmp_path):
    for rank in range(2):
        (tmp_path / f"cwd{rank}").mkdir()
    mp.spawn(_distributed_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [(r["rank"], r["world_size"], r["is_main"]) for r in results] == [
        (0, 2, True),
        (1, 2, False),
    ]
    for result in results:
        assert result["mean"]["loss"] == 2.0
        assert result["mean"]["return"] == 0.25  # rank 1 had no episode: NaN is skipped
        assert result["mean"]["none"] is None or math.isnan(result["mean"]["none"])
        assert result["gathered"] == ["state of 0", "state of 1"]
        assert result["run_dir"] == str(tmp_path / "cwd0")


# --- progress bar -----------------------------------------------------------------------


def test_progress_bar_in_a_log_file_prints_one_line_per_update(monkeypatch):
    monkeypatch.setattr(training.progress, "LOG_INTERVAL_SECONDS", 0.0)
    log = io.StringIO()
    bar = progress_bar(4000, initial=1000, desc="corridor", file=log)
    for _ in range(3):
        bar.update(1000)
        set_metrics(bar, {"success": 0.875})
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0].startswith("corridor:  25% 1.00k/4.00k")
    assert lines[-1].startswith("corridor: 100% 4.00k/4.00k")
    assert "step/s, success=0.875]" in lines[-1]


def test_progress_bar_disabled_on_other_ranks():
    log = io.StringIO()
    bar = progress_bar(10, enabled=False, file=log)
    bar.update(5)
    set_metrics(bar, {"return": 1.0})
    bar.close()
    assert log.getvalue() == ""


def test_span_stats_summarise_each_layer_over_the_interval():
    stats = SpanStats()
    assert stats.summary() == {}  # a core without spans adds nothing
    stats.add(None)
    stats.add((torch.tensor([[0.5], [4.0]]), torch.tensor([[2.0], [0.0]])))
    stats.add((torch.tensor([[9.5], [2.0]]), torch.tensor([[1.0], [3.0]])))
    assert stats.summary() == {
        "span/l0_mean": 4.0,
        "span/l0_max": 9.5,
        "span/l0_near_zero": 0.25,  # e < 1: 0.5
        "span/l1_mean": 1.5,
        "span/l1_max": 3.0,
        "span/l1_near_zero": 0.25,  # 0.0 (1.0 is not below 1)
    }
    assert stats.summary() == {}  # forgotten after a summary


def test_span_stats_over_many_calls_and_a_resume_are_those_of_all_spans_at_once():
    """Calls are kept and summed in passes (`SpanStats.CALLS_PER_SUM`); the statistics are the
    formulas' over every span added, also when the interval is saved and resumed midway."""
    generator = torch.Generator().manual_seed(0)
    calls = [
        tuple(torch.rand(4, 1, generator=generator) * 3 for _ in range(2))
        for _ in range(SpanStats.CALLS_PER_SUM + 45)
    ]
    stats = SpanStats()
    for index, spans in enumerate(calls):
        if index == SpanStats.CALLS_PER_SUM + 20:  # a resume within the interval
            saved = copy.deepcopy(stats.state_dict())
            stats = SpanStats()
            stats.load_state_dict(saved)
        stats.add(spans)
    summary = stats.summary()
    for layer in range(2):
        every = torch.cat([spans[layer].reshape(-1) for spans in calls]).double()
        assert summary[f"span/l{layer}_mean"] == pytest.approx(every.mean().item(), rel=1e-12)
        assert summary[f"span/l{layer}_max"] == every.max().item()
        assert summary[f"span/l{layer}_near_zero"] == pytest.approx((every < 1).double().mean())


def test_thread_count_shares_the_cores_among_local_processes(monkeypatch):
    monkeypatch.setattr(training.host, "available_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_count("auto") == 8
    assert thread_count("auto", local_processes=3) == 2
    assert thread_count("auto", local_processes=16) == 1
    assert thread_count(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a launcher's share of the cores
    assert thread_count("auto", local_processes=2) == 3
    for bad in (0, -2, "two", True, 1.5):
        with pytest.raises(ConfigError, match=f"torch_threads={bad}: give a positive number"):
            thread_count(bad)


def test_use_host_sets_threads_from_torchrun_local_processes(monkeypatch):
    monkeypatch.setattr(training.host, "available_cores", lambda: 4)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        assert training.host.use_host("auto") == 2
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_acting_takes_one_thread_per_8192_values_and_gives_them_back():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        with training.host.acting_threads(64 * 64) as threads:  # 64 environments, 64 wide
            assert threads == torch.get_num_threads() == 1
        assert torch.get_num_threads() == 3
        with training.host.acting_threads(256 * 64) as threads:
            assert threads == torch.get_num_threads() == 2
        with training.host.acting_threads(1024 * 64):  # never more than torch has
            assert torch.get_num_threads() == 3
        with pytest.raises(KeyError), training.host.acting_threads(64):
            raise KeyError  # an error inside gives the threads back too
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_a_run_resumes_only_with_as_many_processes_as_wrote_its_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = OmegaConf.create({"device": "cpu", "torch_threads": torch.get_num_threads()})
    with ExitStack() as resources:
        dist, run_dir = start_run(resources, cfg, {"rng": [{}]})
        assert (dist.world_size, run_dir) == (1, tmp_path)
    with ExitStack() as resources, pytest.raises(ConfigError, match="nproc_per_node=2"):
        start_run(resources, cfg, {"rng": [{}, {}]})


def test_freed_memory_settings_apply_on_glibc_only():
    glibc = platform.libc_ver()[0] == "glibc"
    assert training.host.return_freed_memory() == glibc
    assert training.host.keep_freed_memory() == glibc


def test_a_checkpoint_whose_bytes_changed_is_refused_naming_the_kept_snapshot(tmp_path):
    for step in (10, 20):
        save_checkpoint(
            tmp_path, {"weights": torch.arange(4096.0) + step, "step": step}, keep_last=2
        )
    path = tmp_path / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10  # one bit, inside the weights: the file keeps its size
    path.unlink()  # (the newest snapshot is a hard link of it: keep that one whole)
    path.write_bytes(bytes(data))
    with pytest.raises(ConfigError) as error:
        load_checkpoint(tmp_path)
    message = str(error.value)
    assert "does not match its digest" in message and "\n" not in message
    assert f"newest kept snapshot is {tmp_path / 'checkpoint_20.pt'}" in message
    assert load_checkpoint(tmp_path / "checkpoint_20.pt")["step"] == 20


def _no_space(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_disk_full_while_checkpointing_is_one_error_naming_the_intact_checkpoint(
    tmp_path, monkeypatch
):
    save_checkpoint(tmp_path, {"weights": torch.arange(4.0), "step": 100})
    monkeypatch.setattr(os, "fsync", _no_space)
    with pytest.raises(DiskFullError) as error:
        save_checkpoint(tmp_path, {"weights": torch.zeros(4), "step": 200})
    with pytest.raises(DiskFullError) as best:  # best.pt: the resume point is still named
        save_checkpoint(tmp_path, {"step": 200}, filename="best.pt")
    monkeypatch.undo()
    path = tmp_path / "checkpoint.pt"
    assert f"{path}, the last complete checkpoint, is intact" in str(error.value)
    assert f"{path}, the last complete checkpoint, is intact" in str(best.value)
    assert load_checkpoint(tmp_path)["step"] == 100
    assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt"]


def test_disk_full_while_logging_metrics_is_one_error(tmp_path, monkeypatch):
    cfg = OmegaConf.create({"wandb": {"mode": "disabled"}})
    with MetricsLogger(tmp_path, cfg) as logger:
        logger.log({"loss": 1.0}, step=1)
        monkeypatch.setattr(os, "fsync", _no_space)
        with pytest.raises(DiskFullError, match="no space left on the device of .*metrics.jsonl"):
            logger.log({"loss": 0.5}, step=2)
        monkeypatch.undo()


def test_a_run_directory_belongs_to_one_live_process(tmp_path):
    """A second process is refused, naming the holder; once the holder is killed its claim
    is gone and the directory can be claimed (a resume after a crash)."""
    with claimed_by_another_process(tmp_path) as holder:
        with pytest.raises(ConfigError, match=f"in use by process {holder.pid} on "):
            claim_run_dir(tmp_path)
        with pytest.raises(ConfigError, match=f"in use by process {holder.pid} on "):
            refuse_claimed(tmp_path)
    refuse_claimed(tmp_path)
    claim_run_dir(tmp_path)  # the killed holder's claim left nothing behind
    assert str(os.getpid()) in (tmp_path / ".run.lock").read_text()


@pytest.mark.parametrize(
    "tool", ["analysis.visualize", "analysis.collision_probe", "analysis.module_swap"]
)
@pytest.mark.slow
def test_tools_refuse_a_damaged_checkpoint_in_one_line(tmp_path, tool):
    save_checkpoint(tmp_path, {"weights": torch.arange(4096.0), "step": 1})
    path = tmp_path / "checkpoint.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))
    args = {
        "analysis.module_swap": [str(path)],
        "analysis.visualize": ["--split", "valid", "--out", str(tmp_path / "out")],
    }
    args = [str(path), *args.get(tool, [])]
    result = subprocess.run(
        [sys.executable, "-m", tool, *args], capture_output=True, text=True, cwd=ROOT
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"Config error: {path} does not match its digest: its contents are not what was saved "
        "(a disk or copy error, or not this project's checkpoint)"
    ]


def test_an_optional_part_used_without_its_extra_names_the_extra(monkeypatch):
    monkeypatch.setitem(EXTRAS, "no_such_module", ("video", "an MP4 recording"))
    monkeypatch.setitem(LAUNCHERS, "nowhere", "no_such_module")
    with pytest.raises(
        ConfigError, match=r'^an MP4 recording needs no_such_module, .*"\.\[video\]"'
    ):
        require("no_such_module")
    with pytest.raises(ConfigError, match="no_such_module"):
        require_launcher(["seed=1", "hydra/launcher=nowhere"])
    require_launcher(["hydra/launcher=basic"])  # Hydra's own: nothing to install


def test_an_installed_extra_is_required_without_a_word():
    pytest.importorskip("popgym", reason='the popgym extra: pip install -e ".[popgym]"')
    require("popgym")  # installed by scripts/setup.sh


def test_a_gpu_run_says_when_its_environments_leave_the_gpu_idle(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H200")
    gpu = torch.device("cuda", 0)
    line = describe_device(gpu, 32)
    assert line.startswith("device: cuda:0 (NVIDIA H200); 32 environments leave it mostly idle")
    assert "\n" not in line
    assert describe_device(gpu, GPU_FILLING_ENVS) == "device: cuda:0 (NVIDIA H200)"
    assert describe_device(gpu) == "device: cuda:0 (NVIDIA H200)"  # (a language model)
    assert describe_device(torch.device("cpu"), 32).startswith("device: the CPU, ")
