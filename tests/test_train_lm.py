"""train_lm.py and analysis.visualize: config errors, learning, memory beyond a fixed span, exact
resume after a kill, torchrun with two processes, the span visualisation."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tiny_rl import STEPS_PER_UPDATE, TINY_RL

from analysis import collision_probe, instruction_probe, visualize
from lm import IGNORE, load_task
from lm.collision import CollisionRules, baseline_errors, simulate, split_seed
from scripts import load_script, record_closing
from training.checkpoint import save_checkpoint
from training.config import ConfigError
from training.distributed import DistInfo
from training.resume import resumed_config

ROOT = Path(__file__).resolve().parents[1]
TEXT_FILE = Path(argparse.__file__)  # ~100 kB of English and Python that every Python ships
# A small model and short runs; data generated into a per-session cache.
SMALL = [
    "memory.num_layers=2",
    "memory.dim=32",
    "memory.num_heads=2",
    "memory.ffn_dim=64",
    "memory.block_len=16",
    "memory.max_span=32",
    "memory.ramp=8",
    "batch_size=4",
    "eval_batch_size=4",
    "valid_prefix=2048",
    "warmup_steps=0",
    "wandb.mode=disabled",
    "log_interval=1",
    "eval.after_training=false",  # no test-split pass at the end (text_run makes one)
]
VOLATILE = ("tokens_per_s",)  # timing: the one metric that differs between identical runs


train_lm = load_script("train_lm")


def command(args, run_dir, launcher=(sys.executable,)):
    return [*launcher, str(ROOT / "train_lm.py"), *args, f"hydra.run.dir={run_dir}"]


def run(args, run_dir, timeout=300, launcher=(sys.executable,), cwd=ROOT):
    return subprocess.run(
        command(args, run_dir, launcher),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )


def metrics(run_dir) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def final(run_dir, key):
    return [r[key] for r in metrics(run_dir) if key in r][-1]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def compose_config(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose("lm", overrides=list(overrides))


def resumed(cfg, checkpoint, overrides, config_name="lm"):
    """`resumed_config` as a trainer's Hydra main calls it, Hydra initialised."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return resumed_config(cfg, checkpoint, overrides, config_name)


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["memory.block_len=0"], "memory.block_len"),
        (["batch_size=0"], "batch_size"),
        (["total_steps=-5"], "total_steps"),
        (["lr=0"], "lr"),
        (["min_lr_ratio=2"], "min_lr_ratio"),
        (["memory.kind=lstm"], "expire_span"),
        (["memory.dim=30", "memory.num_heads=4"], "divisible"),
        (["wandb.mode=sometimes"], "offline"),
        (["eval.split=dev"], "valid"),
        (["mode=eval"], "checkpoint=PATH"),
        (["task=text"], "task.path"),
        (["init_from=no/such/run"], "init_from=no/such/run: no checkpoint"),
        (["precision=fp16"], "bf16"),
        (["precision=bf16", "device=cpu"], "on CUDA only: on a CPU without bfloat16"),
        (["compile_step=fast"], "compile_step=fast is not a known compile_step"),
    ],
)
def test_bad_config_values_are_named(overrides, expected):
    with pytest.raises(ConfigError, match=expected):
        train_lm.check_config(compose_config(*overrides))


def test_bad_task_options_are_config_errors(tmp_path):
    cfg = compose_config("task=copy", "task.distance=0", f"task.cache_dir={tmp_path}")
    with pytest.raises(ConfigError, match="task=copy: distance must be at least 1"):
        train_lm.load_data(cfg.task, DistInfo())


@pytest.mark.slow
def test_config_error_exits_with_code_2_before_any_work(tmp_path):
    result = run(["memory.block_len=0"], tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert "memory.block_len" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_unknown_task_names_the_valid_choices(tmp_path):
    result = run(["task=enwik9"], tmp_path / "run")
    assert result.returncode != 0
    for choice in ("enwik8", "text", "collision", "copy", "instruction"):
        assert choice in result.stderr


@pytest.mark.slow
def test_missing_enwik8_says_where_to_put_it(tmp_path):
    # a relative data_dir is read from where the run was started
    result = run(["task=enwik8", "task.data_dir=corpus"], tmp_path / "run", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "enwik8.zip" in result.stderr and str(tmp_path / "corpus") in result.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_bf16_step_autocasts_the_model_but_keeps_spans_and_the_loss_in_float32():
    """precision=bf16's code path, run here under the CPU's autocast (the config refuses bf16
    on a CPU only for its speed): the step's loss follows fp32's to bfloat16's precision, the
    spans stay float32 (in bfloat16 they are off by several positions at L = 4096), and the
    carried memory goes on to the next block."""
    torch.manual_seed(0)
    cfg = compose_config(*SMALL, "memory.max_span=4096")
    model = train_lm.build_model(cfg, 64)
    rows = train_lm.Split(*(np.random.default_rng(0).integers(0, 64, (4, 64)),) * 2, None)
    losses = {}
    for precision in ("fp32", "bf16"):
        cfg.precision = precision
        torch.manual_seed(1)
        copy = train_lm.build_model(cfg, 64)
        copy.load_state_dict(model.state_dict())
        optimizer = torch.optim.Adam(copy.parameters(), lr=0.0)
        progress = train_lm.LMProgress()
        for _ in range(2):
            out = train_lm.train_step(cfg, copy, copy, optimizer, rows, progress, DistInfo())
            progress.step += 1
        losses[precision] = progress.interval["loss_sum"] / progress.interval["scored"]
        assert len(out.spans) == cfg.memory.num_layers
        assert all(span.dtype == torch.float32 for span in out.spans)
        assert progress.state.time == 2 * cfg.memory.block_len
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    assert losses["bf16"] != losses["fp32"]  # (autocast did act)


@pytest.mark.slow  # (Dynamo traces every padded length)
def test_a_compiled_step_compiles_once_for_each_padded_length():
    """compile_step: before each step the carried memory is compacted and padded in front to
    few lengths (`MemoryState.compacted`), so Dynamo (here with an eager backend that counts
    what torch.compile would compile) makes one graph for each padded length, where the eager
    memory takes many lengths; every step's loss and memory size, and the weights after it,
    are the eager step's to float rounding, also after the rows start over."""
    torch._dynamo.reset()
    common = [*SMALL, "memory.max_span=64", "memory.init_span_fraction=0.5", "lr=1e-2"]
    rows = train_lm.Split(*(np.random.default_rng(0).integers(0, 64, (4, 16 * 6)),) * 2, None)
    graphs = []

    def counting_backend(graph, inputs):
        graphs.append(graph)
        return graph.forward

    runs = []
    for compile_step in ("false", "default"):
        cfg = compose_config(*common, f"compile_step={compile_step}")
        torch.manual_seed(0)
        model = train_lm.build_model(cfg, 64)
        step_model = model
        if cfg.compile_step:
            step_model = torch.compile(model, backend=counting_backend, dynamic=False)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
        progress, losses, lengths = train_lm.LMProgress(), [], set()
        for _ in range(9):  # the rows' six blocks, then three from their start again
            out = train_lm.train_step(cfg, model, step_model, optimizer, rows, progress, DistInfo())
            progress.step += 1
            losses += [progress.interval["loss_sum"], float(out.memory_size)]
            lengths.add(tuple(s.length for layer in out.state.layers for s in layer.stores()))
        runs.append((losses, lengths, model))
    (eager_losses, eager_lengths, eager), (losses, lengths, compiled) = runs
    assert len(graphs) == len(lengths) < len(eager_lengths)
    assert losses == pytest.approx(eager_losses, rel=1e-5)
    for weight, expected in zip(compiled.parameters(), eager.parameters(), strict=True):
        # (where a gradient is near 0, its rounding can turn the sign of a step of about lr)
        torch.testing.assert_close(weight, expected, rtol=0, atol=cfg.lr / 20)


def test_learning_rate_warms_up_linearly_then_decays_by_cosine():
    cfg = compose_config("lr=1e-3", "warmup_steps=10", "total_steps=110", "min_lr_ratio=0.1")
    rates = [train_lm.learning_rate(cfg, step) for step in range(110)]
    assert rates[:10] == pytest.approx([1e-3 * (s + 1) / 10 for s in range(10)])
    assert rates[10] == pytest.approx(1e-3)
    assert rates[60] == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half way: cosine at pi / 2
    assert rates[-1] > 1e-4 and train_lm.learning_rate(cfg, 110) == pytest.approx(1e-4)
    assert all(a >= b for a, b in zip(rates[10:], rates[11:], strict=False))


# ------------------------------------------------------------------ learning


def unigram_entropy_bits(data: bytes) -> float:
    counts = np.bincount(np.frombuffer(data, dtype=np.uint8), minlength=256)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
    """A short expire-span run on a small text; its checkpoint is shown by the visualiser."""
    run_dir = tmp_path_factory.mktemp("text") / "run"
    args = [
        *SMALL,
        "task=text",
        f"task.path={TEXT_FILE}",
        "memory.dim=64",
        "memory.num_heads=4",
        "memory.ffn_dim=128",
        "memory.block_len=32",
        "memory.max_span=64",
        "batch_size=8",
        "lr=2e-3",
        "warmup_steps=20",
        "total_steps=300",
        "log_interval=50",
        "eval_interval=150",
        "checkpoint_interval=150",
        "valid_prefix=4096",
        "eval.after_training=true",
    ]
    result = run(args, run_dir)
    assert result.returncode == 0, result.stderr
    return run_dir


def valid_start(size: int) -> int:
    """Where the text task's validation split starts (5% valid, then 5% test, at the end)."""
    return size - 2 * int(size * 0.05)


@pytest.mark.xdist_group("text_run")  # (its module-scoped fixture)
@pytest.mark.slow
def test_text_run_predicts_bytes_better_than_their_frequencies(text_run):
    data = TEXT_FILE.read_bytes()
    valid = data[valid_start(len(data)) :][:4096]
    records = metrics(text_run)
    assert [r["step"] for r in records] == [50, 100, 150, 200, 250, 300]
    first, last = records[0], records[-1]
    assert last["valid_bpb"] == pytest.approx(last["valid_loss"] / math.log(2))
    assert last["valid_bpb"] < unigram_entropy_bits(valid) - 1.0
    assert last["train_loss"] < first["train_loss"] - 1.0
    for key in ("memory_size", "tokens_per_s", "train_bpb", "aux_loss", "valid_memory_size"):
        assert last[key] > 0
    for layer in range(2):  # the spans of the last training block's new memories
        assert 0 <= last[f"span/l{layer}_mean"] <= last[f"span/l{layer}_max"] <= 64
        assert 0 <= last[f"span/l{layer}_near_zero"] <= 1


@pytest.mark.xdist_group("text_run")  # (its module-scoped fixture)
@pytest.mark.slow
def test_eval_mode_scores_a_checkpoint_as_training_did(text_run):
    result = run(["mode=eval", f"checkpoint={text_run}", "eval.split=valid", "eval.tokens=4096"],
                 text_run.parent / "eval")  # fmt: skip
    assert result.returncode == 0, result.stderr
    scored = json.loads(result.stdout.strip().splitlines()[-1])
    assert scored["step"] == 300 and scored["tokens"] == 4096
    assert scored["valid_bpb"] == pytest.approx(final(text_run, "valid_bpb"), rel=1e-6)
    for change in ("memory.max_span=128", "task.name=copy"):  # ignored before: refused now
        refused = run(["mode=eval", f"checkpoint={text_run}", change], text_run.parent / "eval")
        assert refused.returncode != 0
        assert f"{change} (the model has " in refused.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_finished_run_scores_the_test_split_as_eval_mode_does_and_draws_its_curves(
    text_run,
):
    finished = json.loads((text_run / "eval.json").read_text())  # eval.after_training
    result = run(["mode=eval", f"checkpoint={text_run}", "eval.split=test"], text_run.parent / "e")
    assert result.returncode == 0, result.stderr
    scored = json.loads(result.stdout.strip().splitlines()[-1])
    assert finished["step"] == scored["step"] == 300 and finished["tokens"] == scored["tokens"]
    assert finished["test_bpb"] == pytest.approx(scored["test_bpb"], rel=1e-5)
    assert finished["checkpoint"] == "checkpoint.pt"  # the run directory's, beside eval.json
    assert (text_run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = f"test_bpb: {finished['test_bpb']:.4f} over {finished['tokens']:,} tokens"
    assert (
        f"{summary} of the test split ({text_run / 'eval.json'})"
        in (text_run / "train_lm.log").read_text()
    )


@pytest.mark.slow
def test_copy_needs_a_memory_that_reaches_the_first_run(tmp_path, cache_dir):
    """Copy over 16 B's: Transformer-XL with 2 layers x span 4 = 8 < 16 cannot see how many
    A's there were and guesses (chance 1/2 with max_count 2); Expire-Span with L = 32 can,
    across blocks of 16, so only through the memory carried from block to block."""
    common = [
        *SMALL,
        "task=copy",
        "task.distance=16",
        "task.max_count=2",
        "task.train_episodes=8000",
        "task.valid_episodes=256",
        f"task.cache_dir={cache_dir}",
        "memory.dim=64",
        "memory.num_heads=4",
        "memory.ffn_dim=128",
        "batch_size=8",
        "lr=1e-3",
        "warmup_steps=20",
        "total_steps=800",
        "log_interval=100",
        "eval_interval=800",
        "checkpoint_interval=800",
        "valid_prefix=4096",
    ]
    expire = [*common, "memory=expire_span", "memory.max_span=32", "memory.init_span_fraction=0.9"]
    fixed = [*common, "memory=transformer_xl", "memory.max_span=4"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    # load the data once, then train both models side by side (one core each)
    train_lm.load_data(compose_config(*common).task, DistInfo())
    runs = {
        name: subprocess.Popen(
            command(args, tmp_path / name),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, args in (("expire", expire), ("fixed", fixed))
    }
    for name, process in runs.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"{name}: {stderr}"
    assert final(tmp_path / "expire", "valid_accuracy") >= 0.9
    assert final(tmp_path / "fixed", "valid_accuracy") == pytest.approx(0.5, abs=0.1)
    assert final(tmp_path / "fixed", "memory_size") == pytest.approx(4, abs=0.1)


@pytest.mark.parametrize(
    "hard, valid_prefix, total_steps",
    # an easy-task model trains 20 steps, enough to answer with quadrants, so that misread
    # answer slots would show
    [("true", "null", 2), ("true", "512", 2), ("false", "null", 20)],
)
def test_collision_runs_log_the_baselines_of_the_split_they_score(
    hard, valid_prefix, total_steps, tmp_path, cache_dir, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra
    task = ["task.grid_size=4", "task.train_steps=300", "task.valid_steps=400", f"task.hard={hard}"]
    cfg = compose_config(
        *SMALL,
        "task=collision",
        *task,
        f"task.cache_dir={cache_dir}",
        f"total_steps={total_steps}",
        f"valid_prefix={valid_prefix}",
    )
    train_lm.train(cfg, None)
    last = metrics(tmp_path)[-1]
    if valid_prefix == "512":  # a prefix: the whole split's references would mislead
        assert "valid_constant_error" not in last
        return
    rules = CollisionRules(hard=hard == "true", grid_size=4)
    world = simulate(400, rules, split_seed(0, "valid"))
    expected = baseline_errors(world, rules)
    assert last["valid_constant_error"] == pytest.approx(expected["constant_error"])
    assert last["valid_last_collision_error"] == pytest.approx(expected["last_collision_error"])
    # the probe reads the split as evaluation does (4 rows of 100 steps): the same error
    assert collision_probe.main([str(tmp_path), "--rows", "4"]) == 0
    probe = json.loads(capsys.readouterr().out)
    assert probe["all"]["error"] == pytest.approx(last["valid_error"])
    assert probe["all"]["count"] == (world.answers != IGNORE).any(axis=1).sum() > 100
    assert probe["references"] == pytest.approx(expected)
    if hard == "false":
        assert probe["?last"]["count"] + probe["?recent"]["count"] == probe["all"]["count"]


def test_instruction_probe_reads_the_split_as_evaluation_does(
    tmp_path, cache_dir, monkeypatch, capsys
):
    """With the run's rows and prefix, the probe scores the executions evaluation scored."""
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra
    task = ["task=instruction", "task.mean_distance=40", "task.train_tokens=4000"]
    task += ["task.valid_tokens=6000", "task.test_tokens=500", f"task.cache_dir={cache_dir}"]
    cfg = compose_config(*SMALL, *task, "total_steps=30", "valid_prefix=4000", "lr=1e-2")
    train_lm.train(cfg, None)
    assert instruction_probe.main([str(tmp_path), "--rows", "4", "--tokens", "4000"]) == 0
    probe = json.loads(capsys.readouterr().out)
    last = metrics(tmp_path)[-1]
    assert probe["accuracy"] == pytest.approx(last["valid_accuracy"])
    options = dict(mean_distance=40, train_tokens=4000, valid_tokens=6000, test_tokens=500)
    valid = load_task("instruction", **options, cache_dir=cache_dir).valid
    assert probe["count"] == valid.head(4000).num_answers > 5
    assert sum(group["count"] for group in probe["by_distance"].values()) == probe["count"]


@pytest.mark.slow  # (a step of the paper's model takes seconds)
def test_the_papers_instruction_model_trains_a_step(tmp_path, cache_dir, monkeypatch):
    """`+model=paper_instruction` is the paper's model (A.3.2), and it runs."""
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra
    task = ["task=instruction", "task.train_tokens=4000", "task.valid_tokens=1000"]
    task += ["task.test_tokens=1000", f"task.cache_dir={cache_dir}"]
    run = ["total_steps=1", "batch_size=2", "eval_batch_size=2", "valid_prefix=256"]
    run += ["eval.after_training=false"]
    cfg = compose_config(*task, "+model=paper_instruction", *run, "wandb.mode=disabled")
    memory = cfg.memory
    assert (memory.num_layers, memory.dim, memory.num_heads, memory.ffn_dim) == (6, 512, 8, 2048)
    assert (memory.ramp, memory.aux_loss_coef, cfg.lr, cfg.warmup_steps) == (64, 2e-6, 7e-4, 8000)
    train_lm.check_config(cfg)
    train_lm.train(cfg, None)
    record = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert math.isfinite(record["train_loss"]) and math.isfinite(record["valid_loss"])


def test_init_from_starts_a_finer_grid_from_the_coarse_grids_weights(
    tmp_path, cache_dir, monkeypatch
):
    """A curriculum step: a 4 x 4 collision run's weights start an 8 x 8 model. Cells take
    the rows of the coarse cells that hold them; every other weight is copied; a model of
    another size is refused with a message that says so."""
    task = ["task=collision", "task.train_steps=300", "task.valid_steps=400"]
    task += [f"task.cache_dir={cache_dir}", "total_steps=2", "valid_prefix=512"]
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra
    train_lm.train(compose_config(*SMALL, *task, "task.grid_size=4"), None)
    coarse = torch.load(tmp_path / "checkpoint.pt", map_location="cpu", weights_only=True)
    vocab = CollisionRules(grid_size=8).vocab
    model = train_lm.build_model(compose_config(*SMALL, *task), len(vocab))
    train_lm.transfer_weights(model, str(tmp_path), vocab)
    fine = {name: weight.cpu() for name, weight in model.state_dict().items()}
    for name in ("embedding.weight", "head.weight", "head.bias"):
        for token, source in [("x5", "x2"), ("y1", "y0"), ("?blue", "?blue"), ("quadrant3",) * 2]:
            row = fine[name][vocab.index(token)]
            assert torch.equal(row, coarse["model"][name][coarse["vocab"].index(source)])
    core = [name for name in fine if name.startswith("core.")]
    assert core and all(torch.equal(fine[name], coarse["model"][name]) for name in core)
    loaded = f"init_from: loaded {tmp_path / 'checkpoint.pt'} (step 2): {len(fine)} weights"
    values = sum(weight.numel() for weight in fine.values())
    assert train_lm.transfer_weights(model, str(tmp_path), vocab) == (
        f"{loaded}, {values:,} values; skipped none"
    )
    fresh = 32 + 32 + 1  # the new token's embedding row, read-out row and bias
    assert train_lm.transfer_weights(model, str(tmp_path), [*vocab[:-1], "new"]) == (
        f"{loaded}, {values - fresh:,} values; skipped {fresh:,} values, the rows of the 1 of "
        f"{len(vocab)} tokens it lacks (kept fresh)"
    )
    wider = train_lm.build_model(compose_config(*SMALL, *task, "memory.dim=64"), len(vocab))
    with pytest.raises(ConfigError, match="use the memory settings of the run it comes from"):
        train_lm.transfer_weights(wider, str(tmp_path), vocab)


# ------------------------------------------------------------------ resume and torchrun


def comparable(records):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in records]


def test_a_failing_run_closes_its_logger_and_process_group(tmp_path, cache_dir, monkeypatch):
    """Whatever ends the training loop, W&B, the metrics file and the process group are
    closed (here: an exception in the first update's learning-rate schedule)."""
    closed = record_closing(monkeypatch)
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra

    def fail(*args):
        raise RuntimeError("schedule failed")

    monkeypatch.setattr(train_lm, "learning_rate", fail)
    cfg = compose_config(*SMALL, "task=copy", f"task.cache_dir={cache_dir}", "total_steps=4")
    with pytest.raises(RuntimeError, match="schedule failed"):
        train_lm.train(cfg, None)
    assert closed == ["logger 1", "process group"]  # W&B told the run failed


@pytest.mark.slow
def test_killed_run_resumes_exactly_where_it_stopped(tmp_path, cache_dir):
    # constant learning rate, so the schedule does not depend on total_steps
    args = [
        *SMALL,
        "task=collision",
        "task.train_steps=300",  # 2400 tokens: 37 blocks of 16 per row; rows wrap around
        "task.valid_steps=200",
        "task.test_steps=10",
        f"task.cache_dir={cache_dir}",
        "min_lr_ratio=1",
        "eval_interval=25",
        "checkpoint_interval=20",
        "valid_prefix=512",
    ]
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        command([*args, "total_steps=100000"], killed),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    metrics_file = killed / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 30):
        assert process.poll() is None, process.stderr.read().decode()
        assert time.monotonic() < deadline, "the run logged too slowly"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    saved = torch.load(killed / "checkpoint.pt", weights_only=True)
    assert saved["step"] % 20 == 0 and saved["step"] <= len(metrics(killed))
    total = saved["step"] + 40  # past the next epoch boundary (step 37 k)

    result = run([*args, f"total_steps={total}", "resume=true"], killed)
    assert result.returncode == 0, result.stderr
    result = run([*args, f"total_steps={total}"], tmp_path / "uninterrupted")
    assert result.returncode == 0, result.stderr
    resumed, reference = metrics(killed), metrics(tmp_path / "uninterrupted")
    assert [r["step"] for r in resumed] == list(range(1, total + 1))
    assert comparable(resumed) == comparable(reference)


def test_task_paths_are_saved_as_given_so_the_same_command_line_resumes(tmp_path, monkeypatch):
    """task.cache_dir=cache is read from where the run started but saved as given: the same
    command line with resume=true matches the saved config, and a changed setting is refused
    naming the leaf key, not the whole task group."""
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra, and where it started
    args = [*SMALL, "task=copy", "task.cache_dir=cache", "task.train_episodes=300"]
    args += ["task.valid_episodes=40", "task.test_episodes=40", "total_steps=1"]
    train_lm.train(compose_config(*args), None)
    assert list((tmp_path / "cache").glob("copy-*.npz"))  # the data went where it started
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["config"]["task"]["cache_dir"] == "cache"
    assert OmegaConf.load(tmp_path / "config.yaml").task.cache_dir == "cache"
    again = [*args, "resume=true"]
    assert resumed(compose_config(*again), saved, again).task.cache_dir == "cache"
    changed = [*again, "task.distance=8"]
    with pytest.raises(ConfigError) as refused:
        resumed(compose_config(*changed), saved, changed)
    message = str(refused.value)
    assert "but task.distance=8 (the run has 64): drop this override" in message
    assert "{" not in message and message.count("task.") == 1


def test_a_refused_group_override_names_the_leaf_keys_it_changes():
    """RL's `resume=true memory=transformer_xl`: the group's changed keys, not the group."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        run_cfg = compose("rl")
        now = compose("rl", overrides=["memory=transformer_xl", "memory.dim=32"])
    checkpoint = {"config": OmegaConf.to_container(run_cfg, resolve=True)}
    with pytest.raises(ConfigError) as refused:
        overrides = ["resume=true", "memory=transformer_xl", "memory.dim=32"]
        resumed(now, checkpoint, overrides, "rl")
    message = str(refused.value)
    assert "but memory.kind=transformer_xl (the run has expire_span); memory.dim=32 " in message
    assert message.count("memory.dim") == 1 and "{" not in message and "num_heads" not in message


def test_a_setting_added_since_a_run_began_takes_the_resuming_commands_value():
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        run_cfg = OmegaConf.to_container(compose("lm"), resolve=True)
        now = compose("lm", overrides=["resume=true"])
    del run_cfg["precision"], run_cfg["eval"]["split"]  # a run from before they existed
    run_cfg["task"]["name"] = "another"  # (a group of another choice takes nothing of now's)
    del run_cfg["task"][next(k for k in now.task if k != "name")]
    resumed_cfg = resumed(now, {"config": run_cfg}, ["resume=true"])
    assert resumed_cfg.precision == "fp32" and resumed_cfg.eval.split == now.eval.split
    assert OmegaConf.to_container(resumed_cfg.task) == run_cfg["task"]


@pytest.mark.slow
def test_resume_without_a_checkpoint_says_where_it_looked(tmp_path):
    result = run([*SMALL, "resume=true"], tmp_path / "empty")
    assert result.returncode == 2
    assert "checkpoint" in result.stderr and "empty" in result.stderr


@pytest.mark.slow
def test_torchrun_splits_the_rows_and_matches_one_process(tmp_path, cache_dir):
    args = [
        *SMALL,
        "task=copy",
        "task.train_episodes=300",
        "task.valid_episodes=40",
        f"task.cache_dir={cache_dir}",
        "task.test_episodes=40",
        "total_steps=6",
        "eval_interval=3",
        "checkpoint_interval=2",
        "lr=3e-3",
        "eval.after_training=true",
        "device=cpu",  # two processes: on CUDA, two GPUs
    ]
    launcher = (sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2")
    result = run(args, tmp_path / "two", launcher=launcher)
    assert result.returncode == 0, result.stderr
    result = run(args, tmp_path / "one")
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(tmp_path / "two" / "checkpoint.pt", weights_only=True)
    first, second = checkpoint["parameter_digests"]
    assert first == second
    assert len(checkpoint["memory_state"]) == 2
    # each rank takes half of the rows and the loss is averaged over both, so the two
    # processes train the model one process trains, up to float rounding
    two, one = metrics(tmp_path / "two"), metrics(tmp_path / "one")
    assert [r["step"] for r in two] == [r["step"] for r in one] == list(range(1, 7))
    for key in ("train_loss", "grad_norm", "valid_loss", "valid_accuracy", "memory_size"):
        # absent (not logged at that step) or null (no target scored) at the same steps
        ours, theirs = [r.get(key) for r in two], [r.get(key) for r in one]
        assert [v is None for v in ours] == [v is None for v in theirs], key
        numbers = [v for v in theirs if v is not None]
        assert [v for v in ours if v is not None] == pytest.approx(numbers, rel=1e-4), key
    two, one = (json.loads((tmp_path / n / "eval.json").read_text()) for n in ("two", "one"))
    assert two["test_accuracy"] == pytest.approx(one["test_accuracy"], abs=1e-6)
    assert two["test_loss"] == pytest.approx(one["test_loss"], rel=1e-4)


# ------------------------------------------------------------------ span visualisation


def memory_spans(model, ids, num_layers):
    """Spans as the memory stores them: after each block, (position, e_i) of every memory
    still held, read from the carried state."""
    found = [dict() for _ in range(num_layers)]
    state = model.initial_state(1)
    tokens = torch.as_tensor(ids)[None]
    with torch.no_grad():
        for start in range(0, len(ids), model.cfg.block_len):
            _, out = model(tokens[:, start : start + model.cfg.block_len], state)
            state = out.state
            for layer, memory in enumerate(state.layers):
                slots = memory["recent"].view()
                for position, span in zip(
                    slots.position[0].tolist(), slots.span[0].tolist(), strict=True
                ):
                    found[layer][position] = span
    return found


@pytest.mark.xdist_group("text_run")  # (its module-scoped fixture)
@pytest.mark.slow
def test_visualization_shows_the_models_spans_one_row_per_layer(text_run, tmp_path):
    out = tmp_path / "spans"
    assert visualize.main([str(text_run), "--text", str(TEXT_FILE), "--length", "300",
                           "--out", str(out)]) == 0  # fmt: skip
    shown = json.loads((out / "spans.json").read_text())
    spans = np.array(shown["spans"])
    assert spans.shape == (2, 300) and shown["max_span"] == 64
    assert shown["tokens"] == list(TEXT_FILE.read_bytes()[:300])
    assert ((spans >= 0) & (spans <= 64)).all() and spans.std() > 0.01

    model, _, _ = visualize.load_model(text_run)
    stored = memory_spans(model, np.array(shown["tokens"]), 2)
    for layer in range(2):
        positions = sorted(stored[layer])
        assert len(positions) >= 50  # every block leaves at least its last memories
        assert spans[layer, positions] == pytest.approx([stored[layer][p] for p in positions])

    page = (out / "spans.html").read_text()
    assert page.count('<section class="layer"') == 2
    rows = page.split('<section class="layer"')[1:]
    for layer, row in enumerate(rows):
        values = [float(v) for v in re.findall(r'data-span="([^"]+)"', row)]
        assert values == pytest.approx(spans[layer].tolist(), rel=1e-5)
        assert f"darkest: e = {spans[layer].max():.1f}" in row  # each layer on its own scale
    assert (out / "spans.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    passage = visualize.Passage(np.array(shown["tokens"]), shown["labels"], spans, 64, False)
    labels = [axes.get_ylabel() for axes in visualize.render_png(passage, "test").axes]
    assert [label for label in labels if label.startswith("layer")] == ["layer 1", "layer 2"]


@pytest.mark.xdist_group("text_run")  # (its module-scoped fixture)
@pytest.mark.slow
def test_visualization_reads_a_split_of_the_trained_task(text_run, tmp_path):
    out = tmp_path / "valid"
    code = visualize.main([str(text_run), "--split", "valid", "--offset", "10", "--length", "64",
                           "--out", str(out)])  # fmt: skip
    assert code == 0
    shown = json.loads((out / "spans.json").read_text())
    start = valid_start(TEXT_FILE.stat().st_size) + 10
    assert shown["tokens"] == list(TEXT_FILE.read_bytes()[start : start + 64])


@pytest.mark.xdist_group("text_run")  # (its module-scoped fixture)
@pytest.mark.slow
@pytest.mark.parametrize(
    "probe, task", [(collision_probe, "collision"), (instruction_probe, "instruction")]
)
def test_probes_refuse_a_model_of_another_task(probe, task, text_run, capsys):
    with pytest.raises(SystemExit) as stopped:
        probe.main([str(text_run)])
    assert stopped.value.code == 2
    assert f"not a model of the {task} task" in capsys.readouterr().err


def test_visualization_refuses_models_without_expire_spans(tmp_path, capsys):
    config = {"task": {"name": "copy"}, "memory": {"kind": "transformer_xl"}}
    save_checkpoint(tmp_path, {"step": 1, "config": config}, filename="ck.pt")
    assert visualize.main([str(tmp_path / "ck.pt"), "--split", "valid", "--out", "x"]) == 2
    assert "memory=transformer_xl" in capsys.readouterr().err


@pytest.fixture(scope="module")
def rl_run(tmp_path_factory):
    """A one-update train_rl.py run, for the tools that read language models to refuse."""
    run_dir = tmp_path_factory.mktemp("rl") / "run"
    args = [*TINY_RL, f"total_steps={STEPS_PER_UPDATE}", "eval.episodes=4"]
    result = subprocess.run(
        [sys.executable, str(ROOT / "train_rl.py"), *args, f"hydra.run.dir={run_dir}"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return run_dir


@pytest.mark.xdist_group("rl_run")  # (its module-scoped fixture)
@pytest.mark.parametrize(
    "tool, args",
    [
        (visualize, ["--split", "valid", "--out", "spans"]),
        (collision_probe, []),
        (instruction_probe, []),
    ],
    ids=["visualize", "collision_probe", "instruction_probe"],
)
@pytest.mark.slow
def test_language_model_tools_refuse_an_rl_run_in_one_line(tool, args, rl_run, capsys):
    for given in (rl_run, rl_run / "checkpoint.pt"):
        with pytest.raises(SystemExit) as stopped:
            sys.exit(tool.main([str(given), *args]))
        assert stopped.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        (line,) = err.splitlines()
        assert line.startswith(f"python -m {tool.__name__}: error: {given} is ")
        assert "an RL run of train_rl.py (env=corridor)" in line
        assert "language-model runs of train_lm.py" in line and "analysis.curves" in line
