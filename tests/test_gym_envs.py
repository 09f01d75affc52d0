"""Any Gymnasium env from the command line (env=gym): every kind of observation and action
space, the config errors of the ones the agent cannot take, the previous action and reward as
inputs, MMER, POPGym; and the word-window agent's parameters, which checkpoints rely on."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_envs import FLOAT_VALUE
from hydra import compose, initialize_config_dir
from learning import curves, train_on_seeds
from tiny_rl import STEPS_PER_UPDATE, TINY_MEMORY, TINY_RUN

import agents.update
from agents.build import build_agent, build_core
from agents.encoders import FlatEncoder
from agents.play import resets_next_step
from envs.registry import make_env, make_vector_env
from scripts import load_script, script_env
from training.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
FAKE = ["env=gym", "env.id=fake_envs:FakeSpaces-v0", "eval.after_training=false"]
TWO_UPDATES = f"total_steps={2 * STEPS_PER_UPDATE}"


def run(args, run_dir):
    """train_rl.py in a subprocess that can import the fake envs (this directory)."""
    env = script_env()
    command = [sys.executable, str(ROOT / "train_rl.py"), *args, f"hydra.run.dir={run_dir}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def compose_rl(overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        return compose("rl", overrides=overrides)


@pytest.mark.parametrize(
    "observation, action, extra",
    [
        ("box_float", "discrete", []),
        ("image", "multi_discrete", ["env.previous_action=true", "env.previous_reward=true"]),
        ("discrete", "discrete", ["memory=gru", "memory.dim=16"]),
        ("box_float", "box", ["env.previous_action=true"]),
        ("box_float", "box", ["agent=a2c"]),
        ("multi_discrete", "multi_discrete", ["memory=lstm", "memory.dim=16"]),
        ("tuple", "discrete", ["env.vectorization=async", "env.max_episode_steps=3"]),
    ],  # (a Dict observation: test_a_gym_run_resumes_and_evaluates)
)
@pytest.mark.slow
def test_every_space_kind_trains_from_the_command_line(tmp_path, observation, action, extra):
    memory = [] if any(arg.startswith("memory=") for arg in extra) else TINY_MEMORY
    kinds = [f"+env.kwargs.observation={observation}", f"+env.kwargs.action={action}"]
    result = run([*FAKE, *kinds, *TINY_RUN, *memory, *extra, TWO_UPDATES], tmp_path / "run")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [line["step"] for line in lines] == [STEPS_PER_UPDATE, 2 * STEPS_PER_UPDATE]
    if "env.max_episode_steps=3" in extra:  # the step limit truncates: no is_success
        assert all(line["episode_length"] == 3 and line["success"] is None for line in lines)
    else:
        assert all(line["episode_length"] == 5 and 0 <= line["success"] <= 1 for line in lines)
    returns = [line["return"] for line in lines]
    assert [line["mmer"] for line in lines] == [returns[0], max(returns)]


@pytest.mark.slow
def test_a_gym_run_resumes_and_evaluates(tmp_path):
    """A Dict observation, an agent that sees its previous action: resumed, the run keeps its
    MMER (the running maximum of the interval mean return); mode=eval evaluates it."""
    kinds = ["+env.kwargs.observation=dict", "+env.kwargs.action=multi_discrete"]
    args = [*FAKE, *kinds, "env.previous_action=true", *TINY_RUN, *TINY_MEMORY]
    result = run([*args, TWO_UPDATES], tmp_path / "run")
    assert result.returncode == 0, result.stderr
    result = run([*args, f"total_steps={4 * STEPS_PER_UPDATE}", "resume=true"], tmp_path / "run")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    returns = [line["return"] for line in lines]
    assert [line["mmer"] for line in lines] == [max(returns[: i + 1]) for i in range(4)]
    best = torch.load(tmp_path / "run" / "best.pt", weights_only=True)["best"]
    assert best["metric"] == "success"  # the env reports is_success

    result = run(["mode=eval", f"checkpoint={tmp_path / 'run'}", "eval.episodes=8"], tmp_path / "e")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout.strip().splitlines()[-1])["greedy"]
    assert outcome["episodes"] >= 8 and outcome["episode_length"] == 5
    assert 0 <= outcome["success"] <= 1


def test_float_observations_reach_the_encoder_unchanged(tmp_path, monkeypatch):
    """The observation buffer keeps each observation's dtype: a float of 0.37 is not cut to a
    uint8 0 on its way to the encoder, while acting or learning."""
    train_rl = load_script("train_rl")
    seen = []
    forward = FlatEncoder.forward
    monkeypatch.setattr(
        FlatEncoder, "forward", lambda self, obs: (seen.append(obs), forward(self, obs))[1]
    )
    monkeypatch.chdir(tmp_path)  # the run directory outside Hydra
    cfg = compose_rl([*FAKE, *TINY_RUN, *TINY_MEMORY, f"total_steps={STEPS_PER_UPDATE}"])
    train_rl.train(cfg, None)
    acting, learning = seen[0], seen[-1]  # (B, 2, 3), then a minibatch (B/2, T, 2, 3)
    assert acting.shape == (4, 2, 3) and learning.shape == (2, 10, 2, 3)
    for obs in (acting, learning):
        assert obs.dtype == torch.float32
        assert (obs[..., 0, 0] == np.float32(FLOAT_VALUE)).all()


@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "no_such_module:NoSuchEnv-v0"])
def test_an_unknown_id_is_a_one_line_config_error(env_id):
    train_rl = load_script("train_rl")
    with pytest.raises(ConfigError, match="pprint_registry") as error:
        train_rl.make_envs(compose_rl(["env=gym", f"env.id={env_id}"]).env, 1)
    assert f"env.id={env_id} is not a registered" in str(error.value)
    assert "\n" not in str(error.value)


def test_the_corridor_agent_keeps_its_parameters():
    """A state dict of the earlier Corridor agent, whose encoder was Sequential(Linear, ReLU)
    over the flattened word window (`encoder.0`), loads as it is into today's, which encodes
    the window as it did: checkpoints of earlier runs stay valid."""
    cfg = compose_rl(["env=corridor"])  # the default agent
    env = make_env(cfg.env)
    dim, window = cfg.memory.dim, env.observation_space.shape
    core = build_core(cfg.memory)
    torch.manual_seed(0)
    earlier = {
        "encoder.0.weight": torch.randn(dim, math.prod(window)),
        "encoder.0.bias": torch.randn(dim),
        **{f"core.{key}": value for key, value in core.state_dict().items()},
        "policy.weight": torch.randn(4, dim),
        "policy.bias": torch.randn(4),
        "value.weight": torch.randn(1, dim),
        "value.bias": torch.randn(1),
    }
    agent = build_agent(cfg, env.observation_space, env.action_space)
    agent.load_state_dict(earlier)  # strict: the same names and shapes, nothing more
    obs = torch.as_tensor(np.stack([env.reset(seed=seed)[0] for seed in range(3)]))
    weight, bias = earlier["encoder.0.weight"], earlier["encoder.0.bias"]
    expected = torch.relu(obs.flatten(1).float() @ weight.T + bias)
    torch.testing.assert_close(agent.encode(obs, torch.ones(3, dtype=torch.bool)), expected)


@pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason="popgym is not installed")
@pytest.mark.slow
def test_popgym_runs_from_the_command_line(tmp_path):
    result = run(
        ["env=popgym", *TINY_RUN, *TINY_MEMORY, "eval.after_training=false", TWO_UPDATES],
        tmp_path / "run",
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert len(lines) == 2 and "mmer" in lines[-1] and "success" not in lines[-1]


@pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason="popgym is not installed")
@pytest.mark.parametrize("anchor_from, kept", [(-1.0, True), (1.5, False)])
@pytest.mark.slow
def test_a_popgym_anchor_is_kept_by_the_normalised_return(tmp_path, anchor_from, kept):
    """POPGym reports no success: its anchor is kept at a best interval whose return (POPGym's,
    at most 1) reaches anchor_from, so from the first one at -1, and never at 1.5. Two
    intervals of 2 unrolls of 26 steps: RepeatPreviousEasy's episodes end at 51."""
    tiny = [arg for arg in TINY_RUN if not arg.startswith(("unroll_len", "log_interval"))]
    length = ["unroll_len=26", "log_interval=2", "total_steps=416"]
    args = ["env=popgym", *tiny, *length, *TINY_MEMORY, "eval.after_training=false"]
    anchor = ["agent.anchor_coef=1", f"agent.anchor_from={anchor_from}"]
    result = run([*args, *anchor], tmp_path / "run")
    assert result.returncode == 0, result.stderr
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    assert ("anchor" in checkpoint) is kept
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert lines[0]["anchor_kl"] == 0 and (lines[1]["anchor_kl"] > 0) is kept


@pytest.mark.skipif(importlib.util.find_spec("popgym") is None, reason="popgym is not installed")
@pytest.mark.slow
@pytest.mark.learning
def test_the_default_agent_learns_repeat_previous_on_most_seeds(tmp_path):
    """The default agent (expire_span, PPO 8 x 8, 32 environments) on POPGym's
    RepeatPreviousEasy from the command line, seeds 0-2 side by side: a random policy's return
    is about -0.5; at least two of the three reach an MMER of 0 within 96k steps. (At 96k, seeds
    0-5 reached 0.52, -0.04, 0.61, 0.78, 0.26 and 0.85: a bar of 0.5 would pass on four of six.)"""
    args = ["env=popgym", "total_steps=96000", "log_interval=2", "wandb.mode=disabled"]
    lines = train_on_seeds([*args, "eval.after_training=false"], (0, 1, 2), tmp_path)
    assert all(run[-1]["step"] == 96000 and run[0]["return"] < 0 for run in lines.values())
    assert sum(run[-1]["mmer"] >= 0 for run in lines.values()) >= 2, curves(lines, "return")


@pytest.mark.parametrize("vectorization", ["sync", "auto"], ids=["same_step", "next_step"])
def test_a_truncated_episode_bootstraps_from_its_final_observation(
    tmp_path, monkeypatch, vectorization
):
    """ConstantReward-v0 pays 1 per step until a step limit of 4 cuts it: its true value is
    1 / (1 - gamma) = 5 in every state. With a critic that says so, every value target of the
    first unroll is 5 when truncated steps bootstrap from V(final observation); treating the
    limit as the end would give 1 + 0 at each episode's last step. Both autoreset modes:
    Gymnasium's sync vector env resetting in the same step (`info["final_obs"]`), and the
    env's own vector env resetting in the next (auto)."""
    train_rl = load_script("train_rl")
    monkeypatch.chdir(tmp_path)
    build_agent = train_rl.build_agent

    def true_critic(*args):
        agent = build_agent(*args)
        torch.nn.init.zeros_(agent.value.weight)
        torch.nn.init.constant_(agent.value.bias, 5.0)
        return agent

    targets = []

    def spied_advantages(rewards, *args):
        advantages, returns = generalized_advantages(rewards, *args)
        targets.append(returns[rewards == 1])  # (a next-step env's reset steps pay 0)
        return advantages, returns

    generalized_advantages = agents.update.generalized_advantages
    monkeypatch.setattr(train_rl, "build_agent", true_critic)
    monkeypatch.setattr(agents.update, "generalized_advantages", spied_advantages)
    cfg = compose_rl(
        [
            "env=gym",
            "env.id=fake_envs:ConstantReward-v0",
            f"env.vectorization={vectorization}",
            "agent.gamma=0.8",
            *TINY_RUN,
            *TINY_MEMORY,
            f"total_steps={STEPS_PER_UPDATE}",
            "eval.after_training=false",
        ]
    )
    train_rl.train(cfg, None)
    assert resets_next_step(make_vector_env(cfg.env, 2)) == (vectorization == "auto")
    (returns,) = targets
    assert returns.numel() >= STEPS_PER_UPDATE * 3 // 4
    torch.testing.assert_close(returns, torch.full_like(returns, 5.0))


@pytest.mark.slow
def test_cartpole_runs_on_its_own_vector_env(tmp_path):
    """CartPole-v1 registers a vector env of its own, which takes no autoreset_mode and resets
    in the next step: the default vectorisation uses it and trains."""
    cfg = compose_rl(["env=gym", "env.id=CartPole-v1"])
    vec_env = make_vector_env(cfg.env, 4)
    assert type(vec_env).__name__ == "CartPoleVectorEnv" and resets_next_step(vec_env)
    result = run(["env=gym", "env.id=CartPole-v1", *TINY_RUN, *TINY_MEMORY, TWO_UPDATES], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").open()]
    assert len(lines) == 2 and lines[-1]["return"] > 0
