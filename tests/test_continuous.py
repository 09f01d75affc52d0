"""Box actions and Box observations of unknown scale: the Gaussian policy against
torch.distributions, clipping for the env only, a continuous task learned, the running
observation statistics and their exact resume."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hydra import compose, initialize_config_dir
from tiny_rl import TINY_RUN

from agents.actor_critic import ActorCritic
from agents.distributions import Gaussian, log_prob_and_entropy, policy_kl, sample
from agents.encoders import RunningNormaliser, make_encoder
from agents.episodes import EpisodeStats
from agents.play import Player
from agents.recurrent import RecurrentCore
from scripts import load_script, script_env
from training.config import ConfigError
from training.seeding import env_seeds

ROOT = Path(__file__).resolve().parents[1]
TARGET = ["env=gym", "env.id=fake_envs:Target-v0", "memory=gru", "memory.dim=16"]


def run(args, run_dir):
    """train_rl.py in a subprocess that can import the fake envs (this directory)."""
    env = script_env()
    command = [sys.executable, str(ROOT / "train_rl.py"), *args, f"hydra.run.dir={run_dir}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_the_gaussian_policy_is_torchs_diagonal_normal():
    torch.manual_seed(0)
    mean, log_std = torch.randn(5, 3), torch.randn(5, 3) * 0.5
    other = Gaussian(torch.randn(5, 3), torch.randn(5, 3) * 0.5)
    policy = Gaussian(mean, log_std)
    normal = torch.distributions.Normal(mean, log_std.exp())
    actions, sampled_log_prob = sample(policy, torch.randn(5, 3))
    log_prob, entropy = log_prob_and_entropy(policy, actions)
    assert torch.equal(sampled_log_prob, log_prob)
    torch.testing.assert_close(log_prob, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))
    reference = torch.distributions.Normal(other.mean, other.log_std.exp())
    expected = torch.distributions.kl_divergence(normal, reference).sum(-1)
    torch.testing.assert_close(policy_kl(policy, other), expected)
    assert torch.equal(sample(policy, None)[0], mean)
    assert torch.equal(policy[1:3].mean, mean[1:3]) and torch.equal(
        policy[1:3].log_std, log_std[1:3]
    )


def test_the_env_gets_the_action_clipped_and_the_agent_keeps_the_one_it_sampled():
    """A wide Gaussian samples actions outside Box(-1, 1): the env takes them clipped, while
    the step keeps the sampled action and its log-probability under the policy."""
    import fake_envs  # noqa: F401  (registers Target-v0)

    torch.manual_seed(0)
    vec_env = gym.make_vec("Target-v0", num_envs=16, vectorization_mode="vector_entry_point")
    agent = ActorCritic(
        vec_env.single_observation_space, vec_env.single_action_space, RecurrentCore(8), 8
    )
    with torch.no_grad():
        agent.policy.log_std.fill_(np.log(3.0))
    taken = []
    step_envs = vec_env.step
    vec_env.step = lambda actions: (taken.append(actions), step_envs(actions))[1]
    player = Player(vec_env, agent, EpisodeStats(16, "gym"))
    player.reset(env_seeds(0, 0, 16, "train"))
    obs, start = player.obs, player.episode_start
    step = player.step(agent)
    assert step.action.abs().max() > 1
    np.testing.assert_array_equal(taken[0], step.action.clamp(-1, 1).numpy())
    with torch.no_grad():
        policy, _, _ = agent(obs[:, None], agent.initial_state(16), start[:, None])
    normal = torch.distributions.Normal(policy.mean[:, 0], policy.log_std[:, 0].exp())
    torch.testing.assert_close(step.log_prob, normal.log_prob(step.action).sum(-1))
    assert torch.equal(player.previous[0], step.action)  # what the agent sees next


@pytest.mark.parametrize("seed", [100, 101])
@pytest.mark.slow
@pytest.mark.learning
def test_a_continuous_task_is_learned(tmp_path, seed):
    """Target-v0 pays -(a - target)^2 per step, the target shown x100 in the observation: the
    greedy agent's episode return goes from about -1.25 (mean 0) to near 0."""
    args = [
        *TARGET,
        *TINY_RUN,
        "num_envs=8",
        "total_steps=9600",
        "log_interval=10",
        "agent.lr=2e-3",
    ]
    args += [f"seed={seed}", "eval.episodes=16", "eval.num_envs=4"]
    result = run(args, tmp_path / "run")
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "run" / "eval.json").read_text())["greedy"]["return"] > -0.1


def test_running_statistics_are_those_of_every_observation_seen():
    normaliser = RunningNormaliser(3)
    batches = [torch.randn(7, 3) * 40 + 100, torch.randn(2, 5, 3) * 3 - 8, torch.randn(1, 3)]
    for batch in batches:
        normaliser.update(batch)
    seen = torch.cat([batch.reshape(-1, 3) for batch in batches]).double()
    assert normaliser.count.item() == len(seen)
    torch.testing.assert_close(normaliser.mean, seen.mean(0))
    torch.testing.assert_close(normaliser.var, seen.var(0, unbiased=False))
    normalised = normaliser(seen.float())
    torch.testing.assert_close(normalised.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    assert (normaliser(torch.full((1, 3), 1e9)) == RunningNormaliser.CLIP).all()


def test_normalisation_is_on_where_a_box_is_unbounded():
    bounded = spaces.Box(-1.0, 1.0, (2,), np.float32)
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    composite = spaces.Dict({"a": bounded, "b": unbounded})
    has = [isinstance(m, RunningNormaliser) for m in make_encoder(composite, 4).modules()]
    assert sum(has) == 1
    assert not any(isinstance(m, RunningNormaliser) for m in make_encoder(bounded, 4).modules())
    for setting, count in ((True, 2), (False, 0)):
        modules = make_encoder(composite, 4, setting).modules()
        assert sum(isinstance(m, RunningNormaliser) for m in modules) == count


@pytest.mark.slow
def test_the_statistics_move_between_updates_and_resume_exactly(tmp_path):
    """The learner moves the observation statistics after each update (acting and learning
    read an unroll alike: behaviour_ratio_error stays at float error), the checkpoint keeps
    them, and a run stopped midway and resumed writes what an unbroken run writes."""
    args = [*TARGET, *TINY_RUN, "checkpoint_interval=3", "eval.after_training=false"]
    straight = tmp_path / "straight"
    assert run([*args, "total_steps=240"], straight).returncode == 0
    checkpoint = torch.load(straight / "checkpoint.pt", weights_only=True)
    statistics = {k: v for k, v in checkpoint["agent"].items() if "encoder.0." in k}
    assert statistics["encoder.0.count"].item() == 240  # every step of the six unrolls
    assert statistics["encoder.0.var"].min() > 1  # targets x100, steps x50
    lines = [json.loads(line) for line in (straight / "metrics.jsonl").open()]
    assert max(line["behaviour_ratio_error"] for line in lines) < 1e-4

    # the same run, stopped after its first checkpoint (update 3) and resumed
    first = run([*args, "total_steps=120"], tmp_path / "first")
    assert first.returncode == 0, first.stderr
    result = run([*args, "total_steps=240", "resume=true"], tmp_path / "first")
    assert result.returncode == 0, result.stderr

    def logged(run_dir):
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "sps"} for line in lines]

    assert logged(tmp_path / "first") == logged(straight)


def test_an_action_of_several_parts_is_a_one_line_config_error():
    train_rl = load_script("train_rl")
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(
            "rl",
            overrides=[
                "env=gym",
                "env.id=fake_envs:FakeSpaces-v0",
                "+env.kwargs.action=tuple",
            ],
        )
    with pytest.raises(ConfigError, match="several parts") as error:
        train_rl.make_envs(cfg.env, cfg.num_envs)
    assert "\n" not in str(error.value)


def test_a_pull_towards_the_uniform_policy_with_box_actions_is_a_one_line_config_error(tmp_path):
    """agent.cut_uniform_coef needs a uniform policy over the actions, which a Box has not."""
    args = [*TARGET, *TINY_RUN, "agent.cut_uniform_coef=0.1"]
    result = run(args, tmp_path / "run")
    assert result.returncode == 2, result.stderr
    assert "agent.cut_uniform_coef=0.1 pulls towards the uniform policy" in result.stderr
    assert "Traceback" not in result.stderr
