"""A run that diverges (a loss, gradient or parameter that is not finite) says so in one line
and keeps its last finite state, or skips the update with `nonfinite=skip`; an environment's
non-finite observation or reward is refused. The guard alone, then both trainers in
subprocesses."""

import json
import math
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
from omegaconf import OmegaConf
from tiny_rl import STEPS_PER_UPDATE, TINY_MEMORY, TINY_RUN

from agents.play import NonFiniteEnvOutput, refuse_nonfinite
from scripts import ROOT, script_env
from training.distributed import DistInfo
from training.divergence import DIVERGENCE_EXIT_CODE, DivergenceError, DivergenceGuard
from training.metrics import UpdateMeans

PROGRESS_LINE = re.compile(r"\s*\d+%")  # the progress bar's lines on a stderr that is a file


def guarded(mode: str = "stop", skips: int = 2, tmp_path: Path = Path("/nonexistent")):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, amsgrad=True)
    cfg = SimpleNamespace(nonfinite=mode, nonfinite_skips=skips)
    guard = DivergenceGuard(cfg, model, optimizer, DistInfo(), tmp_path, "resume (remedy)")
    return model, optimizer, guard


def take_update(model, optimizer, guard, poison=(), steps=2) -> dict[str, float]:
    """One update of ``steps`` optimiser steps; the steps in ``poison`` (from 1) get a NaN
    input, so their loss and gradient are NaN. Returns the update's mean loss."""
    guard.begin()
    total = 0.0
    for step in range(1, steps + 1):
        x = torch.ones(4, 3) * (math.nan if step in poison else 1.0)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
    return {"train_loss": total / steps}


def state_of(model, optimizer) -> list[torch.Tensor]:
    state = [p.detach().clone() for p in model.parameters()]
    for values in optimizer.state.values():
        state += [v.clone() for v in values.values()]
    return state


def assert_same(state, expected):
    assert len(state) == len(expected)
    for tensor, kept in zip(state, expected, strict=True):
        torch.testing.assert_close(tensor, kept, rtol=0, atol=0)


def test_finite_updates_pass_and_a_non_finite_one_stops_naming_where():
    model, optimizer, guard = guarded()
    for update in (1, 2):
        assert not guard.end(take_update(model, optimizer, guard), update, 10 * update)
    with pytest.raises(DivergenceError) as caught:
        guard.end(take_update(model, optimizer, guard, poison={2}), 3, 30)
    message = str(caught.value)
    assert message.startswith(
        "update 3 (step 30) is not finite in the loss (train_loss), the gradient (from its "
        "optimiser step 2) and the parameters; no checkpoint was saved before it"
    )
    assert caught.value.exit_code == DIVERGENCE_EXIT_CODE


def test_a_gradient_that_overflows_is_named_with_its_step(tmp_path):
    """A finite loss whose gradient is not finite (here set so) is caught at its optimiser
    step, before the parameters it makes NaN; with a checkpoint saved, the line says which
    file holds the last finite state and ends with the trainer's remedy."""
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    model, optimizer, guard = guarded(tmp_path=tmp_path)
    guard.begin()
    model(torch.ones(1, 3)).sum().backward()
    model.bias.grad[0] = math.inf
    optimizer.step()
    with pytest.raises(DivergenceError) as caught:
        guard.end({"train_loss": 1.0}, 1, 40)
    assert str(caught.value) == (
        "update 1 (step 40) is not finite in the gradient (from its optimiser step 1) and the "
        f"parameters; nothing of it was saved ({tmp_path / 'checkpoint.pt'} holds the last "
        "finite state); resume (remedy)"
    )


@pytest.mark.parametrize("finite_updates", [0, 2])
def test_skip_restores_the_parameters_and_moments_and_stops_after_n_in_a_row(finite_updates):
    """A skipped update leaves the parameters and the optimiser's state (AMSGrad's moments
    and step count; none at the run's first update) as they were before it; the skips in a row
    are counted, a finite update resets the count, and the one after nonfinite_skips stops."""
    model, optimizer, guard = guarded("skip", skips=2)
    for update in range(finite_updates):
        assert not guard.end(take_update(model, optimizer, guard), update + 1, update + 1)
    before = state_of(model, optimizer)
    for update in (1, 2):
        assert guard.end(take_update(model, optimizer, guard, poison={1}), update, update)
        assert_same(state_of(model, optimizer), before)
        assert guard.skipped_in_a_row == update
    assert not guard.end(take_update(model, optimizer, guard), 3, 3)
    assert guard.skipped_in_a_row == 0
    for update in (4, 5):
        assert guard.end(take_update(model, optimizer, guard, poison={2}), update, update)
    with pytest.raises(DivergenceError, match="nonfinite_skips=2 updates in a row skipped"):
        guard.end(take_update(model, optimizer, guard, poison={2}), 6, 6)


def judge_on_two_ranks(rank: int, init_file: str, verdicts: str) -> None:
    """One of two gloo ranks judging one update whose loss only rank 1 finds not finite;
    writes what this rank decided."""
    torch_dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2
    )
    model, optimizer, guard = guarded()
    guard.dist = DistInfo(rank=rank, world_size=2)
    guard.begin()
    try:
        verdict = str(guard.end({"train_loss": math.nan if rank else 1.0}, 1, 10))
    except DivergenceError as error:
        verdict = str(error).split(";")[0]
    Path(f"{verdicts}.{rank}").write_text(verdict)
    # The ranks leave together, as a run's do: a group torn down while the other rank's
    # connection is still open aborted a rank once in about a dozen runs.
    torch_dist.barrier()
    torch_dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_stops_when_one_diverges(tmp_path):
    """Under torchrun the ranks reduce their verdicts into one: a loss that only one rank
    finds not finite stops both (the other cannot name its terms)."""
    verdicts = tmp_path / "verdict"
    torch.multiprocessing.spawn(
        judge_on_two_ranks, args=(str(tmp_path / "init"), str(verdicts)), nprocs=2
    )
    assert [Path(f"{verdicts}.{rank}").read_text() for rank in (0, 1)] == [
        "update 1 (step 10) is not finite in the loss",
        "update 1 (step 10) is not finite in the loss (train_loss)",
    ]


def test_the_default_keeps_no_copy_of_the_state():
    model, optimizer, guard = guarded("stop")
    guard.end(take_update(model, optimizer, guard), 1, 1)
    assert guard._saved is None


def test_an_environments_non_finite_output_is_refused_naming_the_environment():
    refuse_nonfinite(np.zeros((3, 2), np.int64), np.zeros(3), {}, 1)  # (only floats count)
    with pytest.raises(NonFiniteEnvOutput, match=r"environment 1 returned a non-finite reward"):
        refuse_nonfinite(np.zeros((3, 2)), np.array([0.0, math.nan, math.inf]), {}, 4)
    obs = (np.zeros((3, 2)), {"a": np.array([[1.0], [2.0], [-math.inf]], np.float32)})
    with pytest.raises(NonFiniteEnvOutput, match=r"environment 2 .* observation \(-inf\)") as e:
        refuse_nonfinite(obs, np.zeros(3, np.float32), {}, 4)
    assert e.value.played == 4 and e.value.env == 2
    final = np.array([None, np.zeros(2), np.array([0.0, math.nan])], dtype=object)
    info = {"final_obs": final, "_final_obs": np.array([False, True, True])}
    with pytest.raises(NonFiniteEnvOutput, match=r"environment 2 .* final observation \(nan\)"):
        refuse_nonfinite(np.zeros((3, 2)), np.zeros(3), info, 5)


def test_skipped_updates_are_counted_apart_from_the_means():
    interval = UpdateMeans(maxima=["largest"], count_skipped=True)
    interval.add({"loss": 1.0, "largest": 2.0}, 10)
    interval.skip({"loss": math.nan, "largest": math.nan}, 10)
    interval.add({"loss": 3.0, "largest": 1.0}, 10)
    summary = interval.summary()
    assert (summary["loss"], summary["largest"], summary["skipped_updates"]) == (2.0, 2.0, 1)
    interval.skip({"loss": math.nan, "largest": math.nan}, 10)
    summary = interval.summary()  # an interval of skipped updates only: no values
    assert math.isnan(summary["loss"]) and math.isnan(summary["largest"])
    assert summary["skipped_updates"] == 1
    assert "skipped_updates" not in UpdateMeans().summary()  # (the default logs no count)


# The trainers, in subprocesses

SPIKE = ["env=gym", "env.id=fake_envs:Spike-v0"]  # reward 1e30 at each env's 25th step
RL_RUN = [*TINY_RUN, *TINY_MEMORY, *SPIKE, "checkpoint_interval=1", "eval.after_training=false"]
LM_RUN = [
    "task=copy",
    "task.distance=8",
    "task.train_episodes=400",
    "task.valid_episodes=64",
    "memory.num_layers=2",
    "memory.dim=32",
    "memory.num_heads=2",
    "memory.ffn_dim=64",
    "memory.block_len=16",
    "memory.max_span=32",
    "batch_size=4",
    "eval_batch_size=4",
    "valid_prefix=1024",
    "warmup_steps=0",
    "min_lr_ratio=1",  # (a constant rate, so that a resume may extend the run)
    "wandb.mode=disabled",
    "log_interval=1",
    "eval_interval=100",
    "checkpoint_interval=1",
    "eval.after_training=false",
]


def run(script: str, args: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args, "torch_threads=1", f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=script_env(),
    )


def the_line(result: subprocess.CompletedProcess) -> str:
    """The one line a stopped run wrote to stderr besides its progress bar."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if not PROGRESS_LINE.match(line)]
    assert len(lines) == 1, result.stderr
    return lines[0]


def load(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def assert_finite_and_equal(weights: dict, expected: dict):
    assert weights.keys() == expected.keys()
    for name, value in weights.items():
        if value.is_floating_point():
            assert value.isfinite().all(), name
        torch.testing.assert_close(value, expected[name], rtol=0, atol=0)


def steps_logged(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").open()]


def resume_as_told(line: str, run_dir: Path, script: str, rates: dict[str, str]):
    """Runs the command the line of a stopped run says to resume with (in ``run_dir``, a
    copy of the run), each `KEY=...` given the value ``rates`` has for it."""
    words = shlex.split(line.split("with a lower rate or a tighter clip: ", 1)[1])
    assert words[:2] == ["python", script] and all(f"{key}=..." in words for key in rates)
    given = [f"{key}={rates[key]}" for key in rates]
    args = [word for word in words[2:] if not word.endswith("=...")]
    args = [word for word in args if not word.startswith("hydra.run.dir=")]
    return run(script, [*args, *given], run_dir)


@pytest.fixture(scope="module")
def diverged_rl_run(tmp_path_factory):
    """An RL run whose third update's value loss overflows (the env's reward spike), and the
    same run given two updates only."""
    root = tmp_path_factory.mktemp("rl")
    result = run("train_rl.py", [*RL_RUN, f"total_steps={4 * STEPS_PER_UPDATE}"], root / "run")
    short = run("train_rl.py", [*RL_RUN, f"total_steps={2 * STEPS_PER_UPDATE}"], root / "short")
    assert short.returncode == 0, short.stderr
    return result, root / "run", root / "short"


@pytest.mark.xdist_group("diverged_runs")  # (its module-scoped fixture)
@pytest.mark.slow
def test_a_diverging_rl_run_stops_in_one_line_keeping_its_last_finite_state(diverged_rl_run):
    result, run_dir, short = diverged_rl_run
    assert result.returncode == DIVERGENCE_EXIT_CODE
    line = the_line(result)
    step = 3 * STEPS_PER_UPDATE
    assert line.startswith(f"Divergence: update 3 (step {step}) is not finite in the loss")
    assert f"python train_rl.py hydra.run.dir={run_dir} resume=true agent.lr=..." in line
    assert steps_logged(run_dir) == [STEPS_PER_UPDATE, 2 * STEPS_PER_UPDATE]
    assert load(run_dir / "checkpoint.pt")["step"] == 2 * STEPS_PER_UPDATE
    for name in ("checkpoint.pt", "best.pt"):  # the run's state before the update
        saved, unbroken = load(run_dir / name), load(short / name)
        assert saved["step"] == unbroken["step"]
        assert_finite_and_equal(saved["agent"], unbroken["agent"])
    optimizer = load(run_dir / "checkpoint.pt")["optimizer"]["state"]
    for index, values in load(short / "checkpoint.pt")["optimizer"]["state"].items():
        assert_finite_and_equal(optimizer[index], values)


@pytest.mark.slow
def test_rl_skip_undoes_the_update_and_counts_it(tmp_path):
    """nonfinite=skip: the spiked update is undone (its checkpoint holds the agent and the
    optimiser of the one before), counted in its metrics line and left out of its means; the
    run goes on."""
    run_dir = tmp_path / "run"
    args = [*RL_RUN, "nonfinite=skip", "checkpoint_keep=4", f"total_steps={4 * STEPS_PER_UPDATE}"]
    result = run("train_rl.py", args, run_dir)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [line["skipped_updates"] for line in lines] == [0, 0, 1, 0]
    assert lines[2]["value_loss"] is None and lines[3]["value_loss"] is not None
    before, skipped, after = (
        load(run_dir / f"checkpoint_{update * STEPS_PER_UPDATE}.pt") for update in (2, 3, 4)
    )
    assert_finite_and_equal(skipped["agent"], before["agent"])
    for index, values in before["optimizer"]["state"].items():
        assert_finite_and_equal(skipped["optimizer"]["state"][index], values)
    assert any(not torch.equal(after["agent"][k], before["agent"][k]) for k in before["agent"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "spiked, at, quantity",  # (an episode is 5 steps: the 25th step's observation is a final one)
    [
        ("reward", 25, "reward"),
        ("observation", 24, "observation"),
        ("observation", 25, "final observation"),
    ],
)
def test_an_env_that_returns_nan_is_refused_in_one_line(tmp_path, spiked, at, quantity):
    args = [
        *RL_RUN,
        "+env.kwargs.spike=nan",
        f"+env.kwargs.spiked={spiked}",
        f"+env.kwargs.at={at}",
    ]
    result = run("train_rl.py", [*args, f"total_steps={4 * STEPS_PER_UPDATE}"], tmp_path / "run")
    assert result.returncode == 2
    step = at * 4  # (each of the 4 envs' at-th step)
    assert the_line(result) == (
        f"Environment error: env.id=fake_envs:Spike-v0: environment 0 returned a non-finite "
        f"{quantity} (nan) at step {step}"
    )


@pytest.fixture(scope="module")
def diverged_lm_run(tmp_path_factory):
    """A finite LM run of two updates resumed for two more at a rate that diverges, and its
    checkpoint's bytes before that."""
    root = tmp_path_factory.mktemp("lm")
    run_dir, cache = root / "run", f"task.cache_dir={root / 'cache'}"
    result = run("train_lm.py", [*LM_RUN, cache, "total_steps=2"], run_dir)
    assert result.returncode == 0, result.stderr
    finite = (run_dir / "checkpoint.pt").read_bytes()
    result = run("train_lm.py", ["resume=true", "total_steps=4", "lr=1e38"], run_dir)
    return result, run_dir, finite


@pytest.mark.xdist_group("diverged_runs")  # (its module-scoped fixture)
@pytest.mark.slow
def test_a_diverging_lm_run_stops_in_one_line_keeping_its_last_finite_state(diverged_lm_run):
    result, run_dir, finite = diverged_lm_run
    assert result.returncode == DIVERGENCE_EXIT_CODE
    line = the_line(result)
    assert line.startswith("Divergence: update 3 (step 3) is not finite in the parameters")
    resume = f"train_lm.py hydra.run.dir={run_dir} resume=true total_steps=4 lr=... grad_clip=..."
    assert resume in line  # (total_steps: the resume's, which the checkpoint does not hold)
    assert (run_dir / "checkpoint.pt").read_bytes() == finite
    saved = load(run_dir / "checkpoint.pt")
    assert saved["step"] == 2
    assert all(value.isfinite().all() for value in saved["model"].values())
    assert steps_logged(run_dir) == [1, 2]


@pytest.mark.slow
def test_lm_skip_undoes_the_update_and_stops_after_nonfinite_skips(tmp_path):
    run_dir, cache = tmp_path / "run", f"task.cache_dir={tmp_path / 'cache'}"
    args = [*LM_RUN, cache, "total_steps=2", "nonfinite=skip", "nonfinite_skips=1"]
    result = run("train_lm.py", args, run_dir)
    assert result.returncode == 0, result.stderr
    before = load(run_dir / "checkpoint.pt")
    result = run("train_lm.py", ["resume=true", "total_steps=4", "lr=1e38"], run_dir)
    assert result.returncode == DIVERGENCE_EXIT_CODE
    line = the_line(result)
    assert line.startswith("Divergence: update 4 (step 4) is not finite in")
    assert "nonfinite_skips=1 updates in a row skipped before it" in line
    skipped = load(run_dir / "checkpoint.pt")  # written after update 3, which was undone
    assert skipped["step"] == 3
    assert_finite_and_equal(skipped["model"], before["model"])
    for index, values in before["optimizer"]["state"].items():
        assert_finite_and_equal(skipped["optimizer"]["state"][index], values)
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert [line["skipped_updates"] for line in lines] == [0, 0, 1]
    assert lines[2]["train_loss"] is None and lines[1]["train_loss"] is not None


@pytest.mark.xdist_group("diverged_runs")  # (its module-scoped fixture)
@pytest.mark.slow
@pytest.mark.parametrize(
    "trainer, rates, expected",
    [
        ("rl", {"agent.lr": "1e-4"}, {"agent.lr": 1e-4}),
        ("lm", {"lr": "1e-3", "grad_clip": "0.3"}, {"lr": 1e-3}),  # (grad_clip: as it was)
    ],
)
def test_the_resume_a_stopped_run_names_goes_on_and_records_the_change(
    request, tmp_path, trainer, rates, expected
):
    """The command the line names, its rates filled in, continues the run from its last
    finite checkpoint to the end, and the run's config.yaml records each rate it changed."""
    result, diverged, *_ = request.getfixturevalue(f"diverged_{trainer}_run")
    run_dir = tmp_path / "run"
    shutil.copytree(diverged, run_dir)
    before = OmegaConf.create(load(run_dir / "checkpoint.pt")["config"])
    resumed = resume_as_told(the_line(result), run_dir, f"train_{trainer}.py", rates)
    assert resumed.returncode == 0, resumed.stderr
    saved = load(run_dir / "checkpoint.pt")
    updates = saved["update"] if trainer == "rl" else saved["step"]
    assert updates == 4 and len(steps_logged(run_dir)) == 4
    changes = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))["changed_at_resume"]
    step = 2 * STEPS_PER_UPDATE if trainer == "rl" else 2
    assert changes == [
        {"step": step, "key": key, "from": OmegaConf.select(before, key), "to": value}
        for key, value in expected.items()
    ]
