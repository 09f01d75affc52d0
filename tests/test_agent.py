"""The actor-critic agent: its losses' formulas and that block mode replays step mode."""

import copy
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tiny_rl import TINY_RL
from torch._inductor.exc import CppCompileError
from torch.distributions import Categorical, kl_divergence

from agents import (
    BASELINE_KINDS,
    RECURRENT_KINDS,
    ActorCritic,
    FeedForwardCore,
    RecurrentCore,
    compiled_step,
)
from agents.anchor import PolicyAnchor, weights_copy
from agents.build import build_agent
from agents.compiled_step import CHECKED_VECTOR_UNITS, add_biases_apart
from agents.core import Core
from agents.distributions import (
    Gaussian,
    kl_from_uniform,
    log_prob_and_entropy,
    most_likely_where,
    policy_kl,
    sample,
    sampling_noise,
)
from agents.episodes import EpisodeStats
from agents.evaluation import evaluate_policies
from agents.losses import actor_critic_loss, generalized_advantages, normalised, ppo_loss
from agents.play import Player
from agents.probes import keep_new_memories, success_by_case, success_by_length
from agents.recurrent import GRULayers, RecurrentState
from agents.rollout import Unroll, collect_unroll, episodes_ending_in
from agents.update import ALL, Learner, make_optimizer, minibatches
from analysis.hesitation import hesitation
from analysis.module_swap import module_group, module_groups, swapped
from analysis.span_drift import drift_split
from envs.registry import make_env, make_vector_env
from memory import MemoryConfig, MemoryTransformer, kind_names
from memory.expire_span import SpanPredictor
from memory.store import EMPTY
from training.distributed import DistInfo
from training.metrics import SpanStats
from training.seeding import env_seeds

OBS_SHAPE = (3, 3, 7)
WINDOW = spaces.Box(0, 1, OBS_SHAPE, np.uint8)  # a MazeBase word window
FOUR_ACTIONS = spaces.Discrete(4)
ROOT = Path(__file__).resolve().parents[1]


def make_agent(
    kind: str, previous: bool = False, action_space: spaces.Space = FOUR_ACTIONS
) -> ActorCritic:
    """A small agent with memory ``kind`` acting in ``action_space``; with ``previous``, it
    sees its previous action and reward."""
    torch.manual_seed(0)
    if kind in RECURRENT_KINDS:
        core = RecurrentCore(dim=32, kind=kind)
    elif kind == "mlp":
        core = FeedForwardCore(dim=32)
    else:
        core = MemoryTransformer(
            MemoryConfig(
                kind=kind, dim=32, num_heads=2, ffn_dim=64, max_span=12, block_len=8, ramp=4
            )
        )
    return ActorCritic(WINDOW, action_space, core, 32, previous, previous)


def discounted_return(rewards, dones, bootstrap, gamma):
    """Reference: the n-step return of every step, walking backwards one element at a time."""
    out = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        running = bootstrap[b]
        for t in reversed(range(rewards.shape[1])):
            running = rewards[b, t] + gamma * running * (1 - dones[b, t])
            out[b, t] = running
    return out


def test_advantages_with_lambda_one_are_n_step_returns_minus_values():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 9))
    dones = (rng.random((3, 9)) < 0.2).astype(float)
    values, bootstrap = rng.normal(size=(3, 9)), rng.normal(size=3)
    advantages, targets = generalized_advantages(
        *(torch.tensor(a) for a in (rewards, values, dones, bootstrap)), gamma=0.9, gae_lambda=1.0
    )
    expected = discounted_return(rewards, dones, bootstrap, 0.9)
    np.testing.assert_allclose(targets.numpy(), expected, atol=1e-12)
    np.testing.assert_allclose(advantages.numpy(), expected - values, atol=1e-12)


def test_advantages_with_lambda_zero_are_one_step_td_errors():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.25, 1.0]])
    dones = torch.tensor([[0.0, 1.0, 0.0]])
    advantages, _ = generalized_advantages(
        rewards, values, dones, torch.tensor([4.0]), gamma=0.5, gae_lambda=0.0
    )
    expected = [1.0 + 0.5 * 0.25 - 0.5, 0.0 - 0.25, 2.0 + 0.5 * 4.0 - 1.0]
    torch.testing.assert_close(advantages, torch.tensor([expected]))


def test_ppo_loss_equals_actor_critic_loss_at_ratio_one():
    """Unclipped (ratio 1), PPO's surrogate has the policy gradient of advantage actor-critic."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 4, requires_grad=True)
    actions = torch.randint(0, 4, (2, 5))
    values, returns, advantages = torch.randn(3, 2, 5)
    old = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1).detach()
    ppo = ppo_loss(logits, values, actions, old, advantages, returns, clip=0.2)
    a2c = actor_critic_loss(logits, values, actions, advantages, returns)
    (ppo_grad,) = torch.autograd.grad(ppo.policy, logits)
    (a2c_grad,) = torch.autograd.grad(a2c.policy, logits)
    torch.testing.assert_close(ppo_grad, a2c_grad)
    assert ppo.value.item() == pytest.approx(a2c.value.item())
    assert ppo.entropy.item() == pytest.approx(a2c.entropy.item())
    assert a2c.entropy.item() <= np.log(4) + 1e-6


def test_advantages_are_normalised_over_the_whole_unroll():
    """One mean and scale for the unroll, not one per environment or minibatch: the second
    environment's advantages, constant but above the unroll's mean, stay positive."""
    advantages = torch.tensor([[0.0, 0.0, 0.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
    returns = torch.tensor([[1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    centred = torch.tensor([[-1.5, -1.5, -1.5, 2.5], [0.5, 0.5, 0.5, 0.5]])  # mean 1.5
    torch.testing.assert_close(normalised(advantages, returns, rewards, "none"), centred)
    std = 2**0.5  # of the unroll's advantages: sqrt((3 * 1.5^2 + 2.5^2 + 4 * 0.5^2) / 7)
    torch.testing.assert_close(normalised(advantages, returns, rewards, "std"), centred / std)
    rms = 0.5**0.5  # of the returns: half ones, half zeros
    torch.testing.assert_close(normalised(advantages, returns, rewards, "returns"), centred / rms)


def test_an_unroll_without_reward_is_only_centred_in_units_of_the_returns():
    """Before any reward the returns are value noise (spread 0.01 here): dividing by their RMS
    would make the advantages' noise a hundred times larger, as large as learning's updates.
    Centred only, it stays 0.01; one reward anywhere in the unroll, and they are divided
    again. The mask keeps a reward outside the unroll's samples from counting."""
    noise = 0.01 * torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    no_reward = torch.zeros(8, 100)
    unscaled = normalised(noise, noise, no_reward, "returns")
    torch.testing.assert_close(unscaled, noise - noise.mean())
    one_reward = no_reward.clone()
    one_reward[3, 50] = 1.0
    rms = noise.square().mean().sqrt()
    torch.testing.assert_close(normalised(noise, noise, one_reward, "returns"), unscaled / rms)
    assert normalised(noise, noise, one_reward, "returns").std().item() > 50 * unscaled.std()
    mask = torch.ones(8, 100, dtype=torch.bool)
    mask[3, 50:] = False  # the reward fell after environment 3's episode ended
    torch.testing.assert_close(
        normalised(noise, noise, one_reward, "returns", mask)[mask],
        normalised(noise[mask], noise[mask], no_reward[mask], "returns"),
    )


def test_solved_task_noise_is_not_blown_up_by_the_returns_scale():
    """A solved task: returns near 0.9, advantages value noise of spread 0.02. Dividing by
    their std makes that noise unit-size; in units of the returns it stays small."""
    noise = 0.02 * torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    returns = 0.9 + noise
    rewards = torch.ones(8, 100)
    assert normalised(noise, returns, rewards, "std").std().item() == pytest.approx(1.0)
    returns_scaled = normalised(noise, returns, rewards, "returns")
    assert returns_scaled.std().item() == pytest.approx(0.02 / 0.9, rel=0.1)


def test_default_advantages_are_unit_size_on_any_reward():
    """The default scaling sizes the policy gradient alike on dense rewards (1 per step, returns
    near 1 / (1 - gamma), as CartPole's) and sparse ones (0.01 now and then), and adding a
    constant to the rewards (with a critic that learned it: the same advantages, returns
    shifted by c / (1 - gamma)) changes nothing."""
    scale = OmegaConf.load(ROOT / "configs" / "agent" / "ppo.yaml").advantage_scale
    rng = torch.Generator().manual_seed(0)
    values = torch.randn(8, 100, generator=rng)
    dones = (torch.rand(8, 100, generator=rng) < 0.02).float()
    sparse = 0.01 * (torch.rand(8, 100, generator=rng) < 0.1).float()
    for rewards in (torch.ones(8, 100), sparse):
        advantages, returns = generalized_advantages(
            rewards, values, dones, torch.zeros(8), 0.99, 0.95
        )
        scaled = normalised(advantages, returns, rewards, scale)
        assert scaled.std().item() == pytest.approx(1.0)
        shifted = normalised(advantages, returns + 100.0, rewards + 1.0, scale)
        torch.testing.assert_close(shifted, scaled)


def _adam_steps(name: str, gradients: list[float]) -> list[float]:
    """The size of each step the learner's optimizer takes on one parameter fed `gradients`."""
    model = torch.nn.Linear(1, 1, bias=False)
    weight = model.weight
    optimizer = make_optimizer(model, name, lr=1.0)
    steps = []
    for gradient in gradients:
        before = weight.item()
        weight.grad = torch.full_like(weight, gradient)
        optimizer.step()
        steps.append(abs(weight.item() - before))
    return steps


def test_amsgrad_keeps_steps_small_once_gradients_shrink():
    """AMSGrad divides by the largest second moment seen, so gradients 100 times smaller
    than those of learning make steps about that much smaller; Adam forgets and steps the
    full learning rate again."""
    gradients = [1.0] * 1000 + [0.01] * 8000
    assert _adam_steps("adam", gradients)[-1] > 0.5
    assert _adam_steps("amsgrad", gradients)[-1] < 0.02


def _policy_steps(agent_cfg, learning: int, solved: int) -> tuple[float, float]:
    """Mean parameter step of a PPO learner configured by ``agent_cfg`` over the last 100
    updates of a learning phase (advantages of size 0.5: a bandit's rewards) and of a solved
    phase (the best action always taken, advantages value noise of spread 0.02)."""
    torch.manual_seed(0)
    features = torch.randn(64, 8)
    policy = torch.nn.Linear(8, 4)
    optimizer = make_optimizer(policy, agent_cfg.optimizer, agent_cfg.lr)
    steps = []
    for update in range(learning + solved):
        logits = policy(features)[None]
        if update < learning:
            actions = torch.distributions.Categorical(logits=logits.detach()).sample()
            returns = (actions == 0).float()
            advantages = returns - returns.mean()
        else:
            actions = torch.zeros(1, 64, dtype=torch.long)
            advantages = 0.02 * torch.randn(1, 64)
            returns = 1.0 + advantages
        old = torch.log_softmax(logits.detach(), -1).gather(-1, actions[..., None])[..., 0]
        scaled = normalised(advantages, returns, returns, agent_cfg.advantage_scale)
        terms = ppo_loss(logits, returns, actions, old, scaled, returns, agent_cfg.clip)
        loss = terms.policy - agent_cfg.entropy_coef * terms.entropy
        before = policy.weight.detach().clone()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append((policy.weight.detach() - before).abs().mean().item())
    return float(np.mean(steps[learning - 100 : learning])), float(np.mean(steps[-100:]))


@pytest.mark.slow
def test_corridor_learner_steps_shrink_once_the_task_is_solved():
    """Once a task is solved, the Corridor's PPO learner's steps shrink with its advantages (in
    units of the returns, under AMSGrad). The earlier learner (advantages divided by their
    std, Adam) kept taking steps as large as those of learning: on the Corridor those steps
    flipped one case of the door choice (docs/history.md)."""
    default = OmegaConf.load(ROOT / "configs" / "agent" / "ppo.yaml")
    corridor = OmegaConf.load(ROOT / "configs" / "preset_env" / "default_corridor.yaml").agent
    corridor = OmegaConf.merge(default, corridor)
    learning, solved = _policy_steps(corridor, learning=300, solved=1000)
    assert solved < 0.05 * learning
    earlier = OmegaConf.merge(
        corridor, {"optimizer": "adam", "advantage_scale": "std", "entropy_coef": 0.01}
    )
    earlier_learning, earlier_solved = _policy_steps(earlier, learning=300, solved=1000)
    assert earlier_solved > 0.2 * earlier_learning and earlier_solved > 10 * solved


def test_ppo_clips_the_ratio():
    # The new policy gives the action probability 0.5; the behaviour policy gave it 0.25 at
    # step 0 (ratio 2) and 0.5 at step 1 (ratio 1).
    logits = torch.zeros(1, 2, 2)
    actions = torch.zeros(1, 2, dtype=torch.long)
    old = torch.log(torch.tensor([[0.25, 0.5]]))
    loss = ppo_loss(
        logits,
        torch.zeros(1, 2),
        actions,
        old,
        torch.tensor([[1.0, -1.0]]),
        torch.zeros(1, 2),
        clip=0.2,
    )
    # Step 0: ratio 2 clipped to 1.2 for a positive advantage; step 1: ratio 1.
    expected = -(1.2 * 1.0 + 1.0 * -1.0) / 2
    assert loss.policy.item() == pytest.approx(expected, abs=1e-6)


def test_policy_kl_is_the_categorical_kl_summed_over_components():
    torch.manual_seed(0)
    p, q = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    expected = kl_divergence(Categorical(logits=p), Categorical(logits=q))
    torch.testing.assert_close(policy_kl(p, q), expected)
    r, s = torch.randn(2, 5, 3), torch.randn(2, 5, 3)
    both = expected + kl_divergence(Categorical(logits=r), Categorical(logits=s))
    torch.testing.assert_close(policy_kl((p, r), (q, s)), both)
    assert policy_kl(p, p).abs().max() < 1e-6


@pytest.mark.parametrize("greedy", [False, True])
def test_acting_scores_its_action_as_the_learner_does(greedy):
    """The log-probability an action is sampled with is the one the learner computes for it,
    exactly, for a categorical and for MultiDiscrete components (whose log-probabilities add)."""
    torch.manual_seed(0)
    p, r = torch.randn(6, 4), torch.randn(6, 3)
    noise = None if greedy else sampling_noise(spaces.MultiDiscrete([4, 3]), 6, p.dtype, "cpu")
    first = None if noise is None else noise[0]
    for policy, drawn in ((p, first), ((p, r), noise)):
        action, log_prob = sample(policy, drawn)
        assert torch.equal(log_prob, log_prob_and_entropy(policy, action)[0])
    action, _ = sample((p, r), noise)
    assert action.shape == (6, 2) and action[:, 1].max() < 3


@pytest.mark.parametrize(
    "space", [spaces.Discrete(4), spaces.MultiDiscrete([4, 3]), spaces.Box(-1, 1, (3,))]
)
def test_noise_made_most_likely_in_some_rows_draws_their_argmax_and_leaves_the_others(space):
    """most_likely_where: the rows it sets draw the most likely action (a categorical's
    argmax, a Gaussian's mean), the other rows the action their own noise draws."""
    torch.manual_seed(0)
    parts = [torch.randn(6, int(n)) for n in getattr(space, "nvec", [getattr(space, "n", 0)])]
    policy = parts[0] if isinstance(space, spaces.Discrete) else tuple(parts)
    if isinstance(space, spaces.Box):
        policy = Gaussian(torch.randn(6, 3), torch.randn(6, 3))
    noise = sampling_noise(space, 6, torch.float32, "cpu")
    rows = torch.tensor([True, False, True, False, False, True])
    mixed, mixed_log_prob = sample(policy, most_likely_where(space, noise, rows))
    likely, likely_log_prob = sample(policy, None)
    sampled, sampled_log_prob = sample(policy, noise)
    assert torch.equal(mixed[rows], likely[rows]) and torch.equal(mixed[~rows], sampled[~rows])
    assert not torch.equal(likely[~rows], sampled[~rows])  # (the test can tell them apart)
    torch.testing.assert_close(mixed_log_prob[rows], likely_log_prob[rows])
    torch.testing.assert_close(mixed_log_prob[~rows], sampled_log_prob[~rows])


def test_policy_anchor_keeps_the_best_agent_once_it_solved_the_task():
    agent = make_agent("transformer_xl")
    anchor = PolicyAnchor(agent, solved=0.95)
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(1.0)
    before = flat_parameters(anchor.model)
    state = agent.initial_state(2)
    anchor.see(0.9, weights_copy(agent), state, new_best=True)  # not solved yet
    assert not anchor.active and torch.equal(flat_parameters(anchor.model), before)
    anchor.see(0.96, weights_copy(agent), state, new_best=True)
    assert anchor.active and torch.equal(flat_parameters(anchor.model), flat_parameters(agent))
    assert not any(p.requires_grad for p in anchor.model.parameters())
    best = flat_parameters(agent)
    nudged(agent)
    anchor.see(0.96, weights_copy(agent), state, new_best=False)
    assert torch.equal(flat_parameters(anchor.model), best)


@pytest.mark.parametrize("follows", [False, True])
def test_an_interval_that_falls_sends_the_anchor_back_to_the_best_agent(follows):
    """A following anchor is the agent of every interval that reaches ``solved``; one below it
    sends the anchor back to the best interval's agent (the one it followed may have lost a
    case), with its memory read by those weights, until an interval holds again. A kept one
    stays at the best throughout."""
    agent = make_agent("expire_span")
    anchor = PolicyAnchor(agent, solved=0.9, follows=follows)
    state = agent.initial_state(2)
    agents = []
    for level, new_best in [(0.95, True), (0.99, True), (0.92, False), (0.5, False), (0.6, False)]:
        nudged(agent)
        agents.append(flat_parameters(agent))
        anchor.see(level, weights_copy(agent), state, new_best)
        if level == 0.92:
            assert torch.equal(flat_parameters(anchor.model), agents[2 if follows else 1])
            following = anchor.state
        if level == 0.5:
            fallen = anchor.state
    assert torch.equal(flat_parameters(anchor.model), agents[1]) and not anchor.held
    assert (fallen is following) != follows  # the memory read again by the best's weights
    assert fallen is anchor.state  # (and not again while it stays there)
    nudged(agent)
    anchor.see(0.93, weights_copy(agent), state, new_best=False)
    expected = flat_parameters(agent) if follows else agents[1]
    assert torch.equal(flat_parameters(anchor.model), expected) and anchor.held


@pytest.mark.parametrize("follows", [False, True])
def test_the_first_anchor_waits_for_intervals_in_a_row_that_hold(follows):
    """With ``after`` = 3 the first anchor needs three intervals in a row at ``solved``: a
    streak broken after two takes none; the third of a new streak takes the best interval's
    agent (a following anchor: that interval's), and from then on a fall no longer lets go."""
    agent = make_agent("expire_span")
    anchor = PolicyAnchor(agent, solved=0.9, follows=follows, after=3)
    state = agent.initial_state(2)
    agents = []
    levels = [(0.95, True), (0.97, True), (0.8, False), (0.92, False), (0.96, False)]
    for level, new_best in levels:
        nudged(agent)
        agents.append(flat_parameters(agent))
        anchor.see(level, weights_copy(agent), state, new_best)
        assert not anchor.active
    assert anchor.streak == 2
    nudged(agent)
    agents.append(flat_parameters(agent))
    anchor.see(0.93, weights_copy(agent), state, new_best=False)
    assert anchor.active and anchor.streak == 3
    assert torch.equal(flat_parameters(anchor.model), agents[5 if follows else 1])
    anchor.see(0.5, weights_copy(agent), state, new_best=False)
    assert anchor.active and anchor.streak == 0
    assert torch.equal(flat_parameters(anchor.model), agents[1])


def flat_parameters(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in module.parameters()])


@pytest.mark.slow
def test_an_anchor_holds_the_policy_while_the_critic_reshapes_the_core():
    """Advantages of 0 (a solved task) leave the policy to the critic's regression on noisy
    targets, which moves the shared core and with it the policy. A KL penalty to the solved
    agent holds the policy; one to the policy of each step's start (PPO's KL penalty to the
    policy that acted) does not: its pull is 0 where each step starts."""
    B, T = 4, 8
    obs = torch.as_tensor(np.random.default_rng(0).integers(0, 2, (B, T, *OBS_SHAPE)))
    obs = obs.to(torch.uint8)
    starts = torch.zeros(B, T, dtype=torch.bool)
    starts[:, 0] = True

    def drift(anchor_coef: float, renewed: bool = False) -> float:
        agent = make_agent("transformer_xl")
        torch.nn.init.orthogonal_(agent.policy.weight, gain=3.0)  # a decided policy
        state = agent.initial_state(B)
        with torch.no_grad():
            start_logits = agent(obs, state, starts)[0]
        anchor = PolicyAnchor(agent, solved=0.95)
        optimizer = torch.optim.Adam(agent.parameters(), lr=3e-3)
        torch.manual_seed(1)
        for _ in range(50):
            if renewed or not anchor.active:
                anchor.hold(weights_copy(agent), state)
            logits, values, _ = agent(obs, state, starts)
            loss = 0.5 * (values - torch.randn(B, T)).pow(2).mean()  # the critic's noise
            anchor.state = state  # (the same unroll each time)
            anchor_logits = anchor.policy(obs, starts, None)
            loss = loss + anchor_coef * policy_kl(logits, anchor_logits).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return policy_kl(logits.detach(), start_logits).mean().item()

    free = drift(0.0)
    assert free > 0.5
    assert drift(1.0) < 0.2 * free
    assert drift(1.0, renewed=True) > 0.8 * free


def act_for(agent: ActorCritic, obs: torch.Tensor, state) -> tuple[torch.Tensor, object]:
    """The agent's logits over the steps of ``obs`` (B, T, ...) in step mode from ``state``
    (no episode starts), and the state after them."""
    logits = []
    continuing = torch.zeros(obs.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for t in range(obs.shape[1]):
            out = agent.core.step(agent.encode(obs[:, t], continuing), state, continuing)
            logits.append(agent.policy(out.hidden))
            state = out.state
    return torch.stack(logits, 1), state


def nudged(agent: ActorCritic, scale: float = 0.05) -> ActorCritic:
    """``agent`` with its weights moved by ``scale`` N(0, 1), as an update moves them."""
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(scale * torch.randn_like(p))
    return agent


@pytest.mark.parametrize("kind", [*kind_names(), *BASELINE_KINDS])
def test_learning_after_an_update_reads_carried_memories_as_acting_does(kind):
    """After an update the learner reads the carried memories' keys, values and spans with the
    new weights (block mode with gradients recomputes them); acting, from the memory refreshed
    with those weights, reads them alike: acting equals learning to float error."""
    B, T = 3, 6
    agent = make_agent(kind)
    obs = torch.as_tensor(np.random.default_rng(0).integers(0, 2, (B, 3 * T, *OBS_SHAPE)))
    _, carried = act_for(agent, obs[:, : 2 * T].to(torch.uint8), agent.initial_state(B))
    nudged(agent)
    unroll = obs[:, 2 * T :].to(torch.uint8)
    continuing = torch.zeros(B, T, dtype=torch.bool)
    refreshed = agent.core.refresh(carried)
    acting, _ = act_for(agent, unroll, refreshed)
    learning = agent(unroll, refreshed, continuing)[0]  # gradients on, as the learner
    torch.testing.assert_close(acting, learning.detach(), atol=1e-5, rtol=1e-5)
    if kind not in BASELINE_KINDS:  # stale keys and values read otherwise
        stale, _ = act_for(agent, unroll, carried)
        assert (stale - learning).abs().max() > 1e-3


@pytest.mark.parametrize("schedule", ["constant", "rate"])
@pytest.mark.parametrize("term", ["anchor", "entropy"])
def test_a_coefficient_schedule_scales_the_coefficient_with_the_rate(term, schedule):
    """agent.anchor_schedule / agent.entropy_schedule=rate: update u of N weighs its term at
    C x (1 - u / N) under the linear rate, C x 1 under a constant one; constant: at C
    throughout; the other coefficient is left at its own value."""
    other = {"anchor": "entropy", "entropy": "anchor"}[term]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(
            "rl",
            overrides=[
                *TINY_RL,
                "agent.anchor_coef=2",
                "agent.entropy_coef=3",
                "agent.lr=1e-3",
                "agent.anchor_until=1",  # (the pull to the end: its earlier end is tested below)
            ],
        )
    agent = make_agent("expire_span")
    for lr_schedule in ("constant", "linear"):
        cfg.agent.lr_schedule = lr_schedule
        cfg.agent[f"{term}_schedule"], cfg.agent[f"{other}_schedule"] = schedule, "constant"
        learner = Learner(agent, cfg.agent, 4, DistInfo(device=torch.device("cpu")))
        coefficients, others, rates = [], [], []
        for update in range(4):
            learner.set_rate(update)
            coefficients.append(getattr(learner, f"{term}_coef"))
            others.append(getattr(learner, f"{other}_coef"))
            rates.append(learner.optimizer.param_groups[0]["lr"])
        linear = [1 - u / 4 for u in range(4)] if lr_schedule == "linear" else [1.0] * 4
        scaled = linear if schedule == "rate" else [1.0] * 4
        assert coefficients == pytest.approx([cfg.agent[f"{term}_coef"] * f for f in scaled])
        assert others == pytest.approx([cfg.agent[f"{other}_coef"]] * 4)
        assert rates == pytest.approx([1e-3 * f for f in linear])


def test_an_anchor_until_lets_go_once_the_rate_has_fallen_that_far():
    """agent.anchor_until=u under anchor_schedule=rate and a linear rate: update k of N holds
    at max(0, 1 - (k / N) / u), the pull 0 from k = u N; the rate is unchanged."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("rl", overrides=[*TINY_RL, "agent.anchor_coef=2", "agent.lr=1e-3"])
    cfg.agent.update(lr_schedule="linear", anchor_schedule="rate", anchor_until=0.5)
    learner = Learner(make_agent("expire_span"), cfg.agent, 8, DistInfo(device=torch.device("cpu")))
    coefficients, rates = [], []
    for update in range(8):
        learner.set_rate(update)
        coefficients.append(learner.anchor_coef)
        rates.append(learner.optimizer.param_groups[0]["lr"])
    holding = [1, 0.75, 0.5, 0.25, 0, 0, 0, 0]
    assert coefficients == pytest.approx([2 * h for h in holding])
    assert rates == pytest.approx([1e-3 * (1 - k / 8) for k in range(8)])


def test_a_pull_let_go_comes_back_while_the_policy_falls_below_anchor_from():
    """Once agent.anchor_until has let the pull go, an interval below anchor_from brings it back
    at the rate's fraction (not the fade's 0), until an interval holds again; before the pull
    is gone a fall changes nothing."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("rl", overrides=[*TINY_RL, "agent.anchor_coef=2"])
    cfg.agent.update(lr_schedule="linear", anchor_schedule="rate", anchor_until=0.5)
    agent = make_agent("expire_span")
    learner = Learner(agent, cfg.agent, 8, DistInfo(device=torch.device("cpu")))
    state, played = agent.initial_state(2), weights_copy(agent)
    coefficients = []
    for update, level in enumerate([0.99, 0.5, 0.99, 0.99, 0.99, 0.5, 0.5, 0.99]):
        learner.anchor.see(level, played, state, new_best=update == 0)
        learner.set_rate(update)
        coefficients.append(learner.anchor_coef)
    assert coefficients == pytest.approx([2, 1.5, 1, 0.5, 0, 2 * 3 / 8, 2 * 2 / 8, 0])


def test_a_checkpoint_keeps_the_anchor_and_the_best_agent_it_falls_back_to():
    """A learner restored from its `state_dict` holds the anchor it followed and the best
    interval's agent, so an interval that falls after a resume sends the anchor where it would
    have gone in the unbroken run."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(
            "rl",
            overrides=[
                *TINY_RL,
                "agent.anchor_coef=1",
                "agent.anchor_from=0.9",
                "agent.anchor_after=1",
            ],
        )
    state = make_agent("expire_span").initial_state(2)
    learners = []
    for _ in range(2):
        torch.manual_seed(0)
        agent = make_agent("expire_span")
        learners.append(Learner(agent, cfg.agent, 8, DistInfo(device=torch.device("cpu"))))
    saved, restored = learners
    for level, new_best in [(0.99, True), (0.95, False)]:
        nudged(saved.agent)
        saved.anchor.see(level, weights_copy(saved.agent), state, new_best)
    restored.load_state_dict(saved.state_dict())
    for learner in learners:
        learner.anchor.see(0.5, weights_copy(learner.agent), state, new_best=False)
    assert flat_parameters(restored.anchor.model).equal(flat_parameters(saved.anchor.model))
    assert restored.anchor.holds(saved.anchor.best) and not restored.anchor.held


def test_a_checkpoint_keeps_the_streak_that_the_first_anchor_waits_for():
    """agent.anchor_after: a learner restored between the intervals of a streak takes its first
    anchor at the same interval as the unbroken run, at the best interval's agent (kept before
    any anchor)."""
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        overrides = [*TINY_RL, "agent.anchor_coef=1", "agent.anchor_from=0.9"]
        cfg = compose(
            "rl", overrides=[*overrides, "agent.anchor_after=3", "agent.anchor_follows=false"]
        )
    agent = make_agent("expire_span")
    state = agent.initial_state(2)
    learners = [Learner(agent, cfg.agent, 8, DistInfo(device=torch.device("cpu"))) for _ in "ab"]
    saved, restored = learners
    for level in (0.95, 0.93):
        nudged(agent)
        saved.anchor.see(level, weights_copy(agent), state, new_best=level == 0.95)
    restored.load_state_dict(saved.state_dict())
    assert not restored.anchored
    for learner in learners:
        learner.anchor.see(0.91, weights_copy(agent), state, new_best=False)
    assert restored.anchored and saved.anchored
    assert restored.anchor.holds(saved.anchor.best)


def test_the_kl_from_uniform_pulls_a_saturated_policy_by_its_probabilities():
    """kl_from_uniform is KL(uniform || policy), summed over MultiDiscrete components; its
    gradient on a categorical's logits is p - 1/A, large where the policy is saturated, where
    the entropy's gradient vanishes."""
    logits = torch.randn(2, 5, 4)
    uniform = Categorical(probs=torch.full((2, 5, 4), 0.25))
    expected = kl_divergence(uniform, Categorical(logits=logits))
    torch.testing.assert_close(kl_from_uniform(logits), expected)
    other = torch.randn(2, 5, 3)
    both = expected + kl_divergence(Categorical(logits=torch.zeros(3)), Categorical(logits=other))
    torch.testing.assert_close(kl_from_uniform((logits, other)), both)
    saturated = torch.tensor([20.0, 0.0, 0.0, 0.0], requires_grad=True)
    (grad,) = torch.autograd.grad(kl_from_uniform(saturated), saturated)
    torch.testing.assert_close(grad, saturated.softmax(-1).detach() - 0.25)
    _, entropy = log_prob_and_entropy(saturated, torch.tensor(0))
    (entropy_grad,) = torch.autograd.grad(entropy, saturated)
    assert grad.abs().max() > 0.7 and entropy_grad.abs().max() < 1e-6
    with pytest.raises(ValueError, match="Discrete"):
        kl_from_uniform(Gaussian(torch.zeros(2), torch.zeros(2)))


def test_the_steps_of_an_episode_cut_within_the_unroll_are_marked_back_to_its_start():
    """episodes_ending_in: the steps from the end before (or the unroll's start) up to an end
    marked as a cut; an episode still running at the unroll's end is not marked."""
    ended = np.array([[0, 0, 1, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0, 1]], bool)
    cut = np.array([[0, 0, 0, 0, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0, 0]], bool)
    expected = np.array([[0, 0, 0, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]], bool)
    np.testing.assert_array_equal(episodes_ending_in(ended, cut), expected)


@pytest.mark.parametrize(("coef", "anchored"), [(0.0, True), (10.0, True), (10.0, False)])
def test_a_solved_policy_is_pulled_towards_uniform_on_the_steps_of_cut_episodes(coef, anchored):
    """agent.cut_uniform_coef: once an anchor holds (the task is solved), the steps of episodes
    a step limit cut within the unroll (corridors of 3-5 cells in at most 6 steps, by an agent
    biased to move north) are pulled towards the uniform policy: an update lowers their KL
    from uniform, and the learner reports that KL (`cut_kl`), only with the pull and an
    anchor."""
    overrides = [*TINY_RL, "env.max_steps=6", "agent.anchor_coef=1", "agent.anchor_from=0"]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose(
            "rl", overrides=[*overrides, f"agent.cut_uniform_coef={coef}", "agent.entropy_coef=0"]
        )
    torch.manual_seed(0)
    vec_env = make_vector_env(cfg.env, cfg.num_envs)
    agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
    with torch.no_grad():  # a start that mostly moves north, into a wall
        agent.policy.bias.copy_(torch.tensor([1.5, 0.0, 0.0, 0.0]))
    player = Player(vec_env, agent, EpisodeStats(cfg.num_envs, cfg.env.name))
    player.reset(env_seeds(cfg.seed, 0, cfg.num_envs, "train"))
    unroll = Unroll(player, cfg.unroll_len)
    collect_unroll(agent, player, unroll, SpanStats(), False)
    assert unroll.cut_episodes.any() and not unroll.cut_episodes.all()

    def kl_on_cut_steps() -> float:
        with torch.no_grad():
            policy, _, _ = agent(unroll.obs, unroll.start_state, unroll.starts, unroll.previous())
        return float(kl_from_uniform(policy)[unroll.cut_episodes].mean())

    before = kl_on_cut_steps()
    learner = Learner(agent, cfg.agent, 10, DistInfo(device=torch.device("cpu")))
    if anchored:
        learner.anchor.hold(weights_copy(agent), unroll.start_state)
    losses = learner.update(unroll, 0)
    pulled = bool(coef) and anchored
    assert (losses["cut_kl"] > 0) is pulled
    assert (kl_on_cut_steps() < 0.8 * before) is pulled
    vec_env.close()


def test_once_an_anchor_holds_greedy_envs_act_greedily_for_the_pull_out_of_loops_alone():
    """agent.greedy_envs: none until an anchor holds; then the last envs act by their most
    likely action, the episode statistics leave their episodes out, the losses leave their
    steps out, and the pull out of loops counts the steps of their cut episodes (corridors of
    3-5 cells in at most 6 steps, by an agent biased to move north)."""
    pull = ("env.max_steps=6", "agent.cut_uniform_coef=1", "agent.greedy_envs=2")
    vec_env, agent, unroll, learner = anchored_learner(*pull)
    assert learner.greedy_envs(4) is None
    learner.anchor.hold(weights_copy(agent), unroll.start_state)
    greedy = learner.greedy_envs(4)
    assert greedy.tolist() == [False, False, True, True]
    with torch.no_grad():
        agent.policy.bias.copy_(torch.tensor([1.5, 0.0, 0.0, 0.0]))
    player = Player(vec_env, agent, EpisodeStats(4, "corridor"))
    player.reset(env_seeds(0, 0, 4, "train"))
    unroll = Unroll(player, 12)
    collect_unroll(agent, player, unroll, SpanStats(), False, greedy)
    with torch.no_grad():
        policy, _, _ = agent(unroll.obs, unroll.start_state, unroll.starts, unroll.previous())
    acted_greedily = unroll.actions == policy.argmax(-1)
    assert acted_greedily[2:].all() and not acted_greedily[:2].all()
    assert len(player.stats.finished["return"]) == int(unroll.dones[:2].sum())
    whole = learner.whole_unroll(unroll)
    assert whole.mask.tolist() == [[True] * 12] * 2 + [[False] * 12] * 2
    assert whole.cut[2:].any()  # (north into a wall until the limit)
    torch.testing.assert_close(whole.cut, unroll.cut_episodes)
    unroll.cut_episodes[:2] = False  # (the greedy envs' loops alone)
    assert learner.update(unroll, 0)["cut_kl"] > 0
    vec_env.close()


def anchored_learner(*overrides: str) -> tuple:
    """A tiny Corridor run's environments, agent (seed 0), one unroll the agent collected and
    its learner, with an anchor that no interval has set yet, under ``overrides``."""
    overrides = (*TINY_RL, "agent.anchor_coef=1", "agent.anchor_from=0", *overrides)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("rl", overrides=list(overrides))
    torch.manual_seed(0)
    vec_env = make_vector_env(cfg.env, cfg.num_envs)
    agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
    player = Player(vec_env, agent, EpisodeStats(cfg.num_envs, cfg.env.name))
    player.reset(env_seeds(cfg.seed, 0, cfg.num_envs, "train"))
    unroll = Unroll(player, cfg.unroll_len)
    collect_unroll(agent, player, unroll, SpanStats(), False)
    return (
        vec_env,
        agent,
        unroll,
        Learner(agent, cfg.agent, 10, DistInfo(device=torch.device("cpu"))),
    )


@pytest.mark.parametrize("anchored", [False, True])
def test_once_an_anchor_holds_the_span_penalty_takes_the_held_alpha(anchored):
    """agent.held_aux_loss_coef: a minibatch's auxiliary loss is eq. 7 at memory.aux_loss_coef
    until an anchor holds, and at agent.held_aux_loss_coef from the next update on (the same
    spans: the loss in the ratio of the two alphas)."""
    alphas = ["memory.aux_loss_coef=1e-3", "agent.held_aux_loss_coef=0.02"]
    vec_env, agent, unroll, learner = anchored_learner(
        *alphas, "memory.attended_span_coef=0", "agent.held_attended_span_coef=null"
    )
    before = update_aux_loss(learner, unroll)
    assert before > 0
    if anchored:
        learner.anchor.hold(weights_copy(agent), unroll.start_state)
    assert update_aux_loss(learner, unroll) == pytest.approx(
        before * (20 if anchored else 1), rel=1e-5
    )
    vec_env.close()


@pytest.mark.parametrize("anchored", [False, True])
@pytest.mark.parametrize("start, held", [(1e-2, 5e-2), (0, 1e-2)])
def test_once_an_anchor_holds_the_attended_pull_takes_the_held_weight(anchored, start, held):
    """agent.held_attended_span_coef: with the span penalty off, a minibatch's auxiliary loss
    is the attended pull at memory.attended_span_coef until an anchor holds, and at the held
    weight from the next update on (in the ratio of the two); held where it was off, it starts."""
    vec_env, agent, unroll, learner = anchored_learner(
        "memory.aux_loss_coef=0",
        "memory.attended_threshold=0.1",
        f"memory.attended_span_coef={start}",
        f"agent.held_attended_span_coef={held}",
        "agent.held_aux_loss_coef=null",  # (the Corridor preset's: the penalty stays off)
    )
    before = update_aux_loss(learner, unroll)
    assert (before > 0) == (start > 0)
    if anchored:
        learner.anchor.hold(weights_copy(agent), unroll.start_state)
    after = update_aux_loss(learner, unroll)
    if start == 0:
        assert (after > 0) == anchored
    else:
        assert after == pytest.approx(before * (held / start if anchored else 1), rel=1e-5)
    vec_env.close()


@pytest.mark.parametrize("memory", ["gru", "transformer_xl"])
def test_a_memory_without_the_held_losses_learns_as_before_once_an_anchor_holds(memory):
    """The Corridor preset's held weights (agent.held_*) reach every memory run there: one
    without a span penalty or an attended pull ignores them, as it ignores memory.*'s."""
    vec_env, agent, unroll, learner = anchored_learner(f"memory={memory}")
    assert learner.cfg.held_aux_loss_coef and learner.cfg.held_attended_span_coef
    before = update_aux_loss(learner, unroll)
    learner.anchor.hold(weights_copy(agent), unroll.start_state)
    assert update_aux_loss(learner, unroll) == before
    vec_env.close()


def update_aux_loss(learner: Learner, unroll: Unroll) -> float:
    """The auxiliary loss of an update's first step over the whole ``unroll``."""
    learner.set_rate(0)
    learner.agent.train()
    return float(learner.forward(learner.whole_unroll(unroll))[2].aux_loss.detach())


def test_the_learner_pulls_towards_the_anchors_policy_from_its_own_memory():
    """The target of an update's anchor KL is the anchor's policy over the unroll, from the
    memory the anchor's own passes carried on (not the agent's)."""
    vec_env, agent, unroll, learner = anchored_learner()
    learner.anchor.hold(weights_copy(agent), unroll.start_state)
    start = learner.anchor.state
    target = learner.whole_unroll(unroll).anchor
    learner.anchor.state = start  # (the anchor's own pass again, from the same memory)
    anchor = learner.anchor.policy(unroll.obs, unroll.starts, unroll.previous())
    torch.testing.assert_close(target, anchor)
    vec_env.close()


def test_the_anchor_reads_its_own_memory():
    """The anchor's policy over an unroll is the anchor acting step by step from its own
    memory (its weights' keys, values and spans), not the agent's memory read with the
    agent's cached keys; and the memory it carries on is what its own passes wrote."""
    B, T = 3, 6
    agent = make_agent("expire_span")
    obs = torch.as_tensor(np.random.default_rng(1).integers(0, 2, (B, 4 * T, *OBS_SHAPE)))
    obs = obs.to(torch.uint8)
    _, carried = act_for(agent, obs[:, :T], agent.initial_state(B))
    anchor = PolicyAnchor(agent, solved=0.95)
    nudged(agent)  # the agent the anchor was kept from acted (and wrote memories) before
    anchor.hold(weights_copy(agent), carried)
    nudged(agent)  # and the agent moves on
    continuing = torch.zeros(B, T, dtype=torch.bool)
    own = anchor.state  # the anchor's memory as its acting would carry it
    for k in (1, 2, 3):
        unroll = obs[:, k * T : (k + 1) * T]
        expected, own = act_for(anchor.model, unroll, own)
        torch.testing.assert_close(anchor.policy(unroll, continuing, None), expected)
        assert (agent(unroll, carried, continuing)[0].detach() - expected).abs().max() > 1e-3
        _, carried = act_for(agent, unroll, agent.core.refresh(carried))


CORE_METHODS = ("initial_state", "forward", "step", "refresh", "save_state", "load_state")


@pytest.mark.parametrize("kind", [*kind_names(), *BASELINE_KINDS])
def test_every_core_kind_is_a_core(kind):
    """The agent, the player and the learner hold a core by `agents.core.Core` alone: every
    kind has its members, and they work together (a step, a refresh, a checkpoint's round
    trip, a learner's block from it)."""
    core = make_agent(kind).core
    assert isinstance(core, Core)
    assert isinstance(core.steps_in_buffers, bool)
    assert all(callable(getattr(core, name)) for name in CORE_METHODS)
    with torch.no_grad():
        out = core.step(
            torch.randn(2, 32), core.initial_state(2, "cpu"), torch.tensor([True, False])
        )
    state = core.load_state(core.save_state(core.refresh(out.state)), "cpu")
    continuing = torch.zeros(2, 3, dtype=torch.bool)
    block = core(torch.randn(2, 3, 32), state, continuing, next_state=False)
    assert block.hidden.shape == (2, 3, 32) and block.state is None


@pytest.mark.parametrize("kind", [*kind_names(), *BASELINE_KINDS])
def test_block_mode_replays_what_step_mode_did(kind):
    """The learner recomputes an unroll in block mode from the memory it started with; its
    log-probabilities and values must be those the actor had, episode boundaries included
    (for the recurrent cores: their block mode steps through a block an episode starts in)."""
    agent = make_agent(kind).eval()
    B, T = 3, 8
    rng = np.random.default_rng(1)
    state = agent.initial_state(B)
    for unroll in range(3):
        obs = torch.as_tensor(rng.integers(0, 2, size=(B, T, *OBS_SHAPE)), dtype=torch.uint8)
        starts = torch.as_tensor(rng.random((B, T)) < 0.15)
        if unroll == 0:
            starts[:, 0] = True
        unroll_state = state
        acted_log_probs, acted_values, actions = [], [], []
        for t in range(T):
            action, log_prob, value, out = agent.act(obs[:, t], state, starts[:, t])
            state = out.state
            acted_log_probs.append(log_prob)
            acted_values.append(value)
            actions.append(action)
        with torch.no_grad():
            logits, values, _ = agent(obs, unroll_state, starts)
        log_probs = torch.log_softmax(logits, -1).gather(-1, torch.stack(actions, 1)[..., None])
        torch.testing.assert_close(values, torch.stack(acted_values, 1), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            log_probs.squeeze(-1), torch.stack(acted_log_probs, 1), atol=1e-5, rtol=0
        )


CHECKED = str(torch._inductor.cpu_vec_isa.pick_vec_isa()).startswith(CHECKED_VECTOR_UNITS)


SPACES = (spaces.Discrete(4), spaces.MultiDiscrete([3, 2]), spaces.Box(-1.0, 1.0, (2,)))
KINDS_AND_SPACES = list(zip(("expire_span", "transformer_xl", "expire_span"), SPACES, strict=True))
NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
UNCHECKED_CPU = pytest.mark.skipif(not CHECKED, reason="compile_acting is refused here")


@pytest.mark.parametrize(
    "kind, action_space, target",
    [pytest.param(*case, "cpu", marks=UNCHECKED_CPU) for case in KINDS_AND_SPACES]
    + [(*KINDS_AND_SPACES[0], "torch.compile on the cpu")]
    + [pytest.param(*case, "cuda", marks=NO_GPU) for case in KINDS_AND_SPACES],
)
@pytest.mark.slow
def test_a_compiled_step_acts_as_the_eager_step(kind, action_space, target, monkeypatch):
    """compile_acting: the compiled step reads the whole buffer of each layer, whose slots
    after the last memory are empty, and samples inside. From the same random numbers it takes
    the eager step's actions (categorical, MultiDiscrete, Gaussian) with their
    log-probabilities, values, memory sizes and memories, through episode starts, the previous
    action and reward, compactions that change the buffers' lengths, and an update of the
    weights in place; another batch size and a greedy step act eagerly. On the CPU the
    AOTInductor library, on CUDA torch.compile's; torch.compile's runner on the CPU (its
    graph run by eager kernels) checks what it is given and returns on any machine."""
    device = torch.device("cuda" if target == "cuda" else "cpu")
    if target == "torch.compile on the cpu":
        monkeypatch.setitem(compiled_step.RUNNERS, "cpu", compiled_step.TorchCompileRunner)
        monkeypatch.setattr(compiled_step.TorchCompileRunner, "backend", "aot_eager")
        monkeypatch.setattr(compiled_step, "refuse_unchecked_target", lambda device: None)
    eager = make_agent(kind, True, action_space).eval().to(device)
    compiled = copy.deepcopy(eager)
    compiled.compile_acting()
    B, T = 3, 60
    rng = np.random.default_rng(2)
    obs = torch.as_tensor(rng.integers(0, 2, size=(B, T, *OBS_SHAPE)), dtype=torch.uint8)
    starts = torch.as_tensor(rng.random((B, T)) < 0.05)
    rewards = torch.as_tensor(rng.random((B, T)), dtype=torch.float32)
    obs, starts, rewards = (x.to(device) for x in (obs, starts, rewards))
    states = [agent.initial_state(B, device) for agent in (eager, compiled)]
    action = torch.as_tensor(np.stack([action_space.sample() for _ in range(B)]), device=device)
    continuous, capacities = isinstance(action_space, spaces.Box), set()
    for t in range(T):
        if t == T // 2:  # an update: the compiled step reads the weights as they are now
            with torch.no_grad():
                for one, other in zip(eager.parameters(), compiled.parameters(), strict=True):
                    change = 0.05 * torch.randn_like(one)
                    one.add_(change)
                    other.add_(change)
        acted = []
        for index, agent in enumerate((eager, compiled)):
            torch.manual_seed(t)
            acted.append(agent.act(obs[:, t], states[index], starts[:, t], (action, rewards[:, t])))
            states[index] = acted[-1][3].state
        (action, *scores, out), (compiled_action, *compiled_scores, compiled_out) = acted
        if continuous:
            torch.testing.assert_close(compiled_action, action, atol=1e-5, rtol=0)
        else:
            assert torch.equal(compiled_action, action)
        torch.testing.assert_close(compiled_scores, scores, atol=1e-5, rtol=0)  # log-prob, value
        assert float(compiled_out.memory_size) == pytest.approx(float(out.memory_size), abs=1e-6)
        capacities.add(states[1].layers[0]["recent"].capacity)
    assert len(capacities) > 1  # compactions changed the buffer's length
    for layer, eager_layer in zip(states[1].layers, states[0].layers, strict=True):
        store, eager_store = layer["recent"], eager_layer["recent"]
        assert torch.equal(store.view().position, eager_store.view().position)
        torch.testing.assert_close(store.view().values, eager_store.view().values)
        spare = store.buffer.narrow(0, store.capacity).position[:, store.length :]
        assert (spare == EMPTY).all() and store.capacity > store.length
    assert compiled.compiled_step.signature == (B, True, False)
    two = torch.tensor([0, 2], device=device)
    values = [
        agent.act(obs[two, 0], state.select(two), starts[two, 0])[2]  # compiled: eagerly
        for agent, state in zip((eager, compiled), states, strict=True)
    ]
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=0)
    greedy = [
        agent.act(obs[:, 0], state, starts[:, 0], (action, rewards[:, 0]), greedy=True)[:3]
        for agent, state in zip((eager, compiled), states, strict=True)
    ]
    torch.testing.assert_close(greedy[1], greedy[0], atol=1e-5, rtol=0)
    assert compiled.compiled_step.signature == (B, True, False)


@pytest.mark.slow  # (Dynamo traces every padded length)
def test_a_compiled_learner_compiles_once_for_each_padded_length(monkeypatch):
    """compile_learner: the start memory's length and time index change from one update to
    the next, but the learner pads its minibatches' stores to few lengths and hands the
    time in as a tensor, so that its model compiles once for each padded length (counted
    here with Dynamo's graphs, run eagerly), and each update is the eager learner's."""
    graphs = []

    def counted(graph: torch.fx.GraphModule, inputs: list) -> Callable:
        graphs.append(graph)
        return graph.forward

    compile_model = torch.compile
    monkeypatch.setattr(
        torch,
        "compile",
        lambda model, mode, dynamic: compile_model(model, backend=counted, dynamic=dynamic),
    )
    torch._dynamo.reset()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("rl", overrides=[*TINY_RL, "compile_learner=default"])
    torch.manual_seed(0)
    vec_env = make_vector_env(cfg.env, cfg.num_envs)
    agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
    dist = DistInfo(device=torch.device("cpu"))
    compiled = Learner(agent, cfg.agent, 10, dist, cfg.compile_learner)
    eager = Learner(agent, cfg.agent, 10, dist)
    player = Player(vec_env, agent, EpisodeStats(cfg.num_envs, cfg.env.name))
    player.reset(env_seeds(cfg.seed, 0, cfg.num_envs, "train"))
    unroll = Unroll(player, cfg.unroll_len)
    lengths, padded, times = set(), set(), set()
    for update in range(8):
        collect_unroll(agent, player, unroll, SpanStats(), False)
        for seen, state in (
            (lengths, unroll.start_state),
            (padded, unroll.start_state.select(ALL, True)),
        ):
            seen.add(tuple(store.length for layer in state.layers for store in layer.stores()))
        times.add(unroll.start_state.time)
        before = copy.deepcopy((agent.state_dict(), compiled.optimizer.state_dict()))
        random = torch.get_rng_state()  # (the same minibatches for both)
        learned = compiled.update(unroll, update)
        weights = copy.deepcopy(agent.state_dict())
        agent.load_state_dict(before[0])
        eager.optimizer.load_state_dict(before[1])
        torch.set_rng_state(random)
        # (abs: the behaviour ratio's error is 0 or a float32 step at 1, 1.2e-7, by kernel)
        assert eager.update(unroll, update) == pytest.approx(learned, rel=1e-5, abs=1e-6)
        torch.testing.assert_close(agent.state_dict(), weights, rtol=1e-5, atol=1e-6)
        compiled.optimizer.load_state_dict(eager.optimizer.state_dict())
    vec_env.close()
    assert len(lengths) > len(padded) >= 2 and len(times) == 8
    assert len(graphs) == len(padded)


def test_biases_added_apart_from_their_products_give_the_same_outputs():
    """`add_biases_apart`: an exported graph's linear layers lose their biases to additions
    of their own, and the graph computes what it did."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(4, 5)
    module = torch.export.export(net, (x,)).module()
    add_biases_apart(module)
    linears = [n for n in module.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert len(linears) == 2 and all(len(node.args) == 2 for node in linears)
    torch.testing.assert_close(module(x), net(x))


def test_a_step_that_cannot_compile_says_how_to_act_without(monkeypatch):
    """The compiler's error (here the one a missing C++ compiler gives) becomes one line that
    says how to act without compiling. (The compiler is not really pointed at a missing
    program: inductor caches what that finds, and a later compile in the process fails.)"""

    def no_compiler(exported, package_path):
        raise CppCompileError(["no-such-compiler"], "not found")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", no_compiler)
    monkeypatch.setattr(compiled_step, "refuse_unchecked_target", lambda device: None)
    agent = make_agent("expire_span").eval()
    agent.compile_acting()
    obs = torch.zeros(2, *OBS_SHAPE, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="compile_acting=false") as error:
        agent.act(obs, agent.initial_state(2), torch.ones(2, dtype=torch.bool))
    assert "\n" not in str(error.value)


def test_a_step_whose_loading_crashes_a_process_is_refused_in_one_line(monkeypatch):
    """Where loading a compiled package crashes the process that loads it (seen on one
    machine), the step is loaded in a process of its own first, and its crash is a one-line
    error that says how to act without it, not the end of the run."""
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(compiled_step, "LOAD", crash)
    monkeypatch.setattr(  # (the package is not needed: its loading crashes)
        torch._inductor, "aoti_compile_and_package", lambda exported, package_path: package_path
    )
    agent = make_agent("expire_span").eval()
    agent.compile_acting()
    obs = torch.zeros(2, *OBS_SHAPE, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="compile_acting=false") as error:
        agent.act(obs, agent.initial_state(2), torch.ones(2, dtype=torch.bool))
    assert "SIGSEGV" in str(error.value) and "\n" not in str(error.value)
    assert agent.compiled_step.runner is None


@pytest.mark.parametrize("isa", ["VecNEON", "VecVSX"])
def test_a_step_vectorized_for_an_unchecked_unit_is_refused(isa, monkeypatch):
    """The step compiled for AVX-512 and AVX2 was checked against the eager step (above; CI
    runs both), and torch.compile's code for AVX2 once gave NaN: for any other vector unit,
    compile_acting is refused in one line that says how to act without it, before anything
    compiles."""
    vectors = getattr(torch._inductor.cpu_vec_isa, isa)()
    monkeypatch.setattr(torch._inductor.cpu_vec_isa, "pick_vec_isa", lambda: vectors)
    agent = make_agent("expire_span").eval()
    agent.compile_acting()
    obs = torch.zeros(2, *OBS_SHAPE, dtype=torch.uint8)
    with pytest.raises(RuntimeError, match="compile_acting=false") as error:
        agent.act(obs, agent.initial_state(2), torch.ones(2, dtype=torch.bool))
    assert "\n" not in str(error.value) and str(vectors) in str(error.value)


@pytest.mark.parametrize("kind", RECURRENT_KINDS)
def test_recurrent_block_mode_equals_a_loop_over_timesteps(kind):
    """Block mode runs the segments between episode starts as one packed batch: its outputs,
    the state after the block and the gradients through time must be those of calling the
    layers one timestep at a time, zeroing the state where an episode starts (two layers;
    starts at the first step, inside the block, at its last step, and none)."""
    torch.manual_seed(0)
    core = RecurrentCore(dim=8, num_layers=2, kind=kind)
    rnn = getattr(core, kind)
    B, K = 4, 9
    x = torch.randn(B, K, 8, requires_grad=True)
    starts = torch.zeros(B, K, dtype=torch.bool)
    starts[0, [0, 3, 4]] = True
    starts[1, K - 1] = True
    starts[3, [2, 6]] = True
    state = [torch.randn(2, B, 8) for _ in range(2 if kind == "lstm" else 1)]
    block = core(x, RecurrentState(*state), starts)
    outputs, carried = [], state
    for k in range(K):
        carried = [s * (~starts[:, k]).float().view(1, B, 1) for s in carried]
        out, after = rnn(x[:, k : k + 1], tuple(carried) if kind == "lstm" else carried[0])
        carried = list(after) if kind == "lstm" else [after]
        outputs.append(out)
    looped = core.norm(torch.cat(outputs, 1))
    torch.testing.assert_close(block.hidden, looped, atol=1e-6, rtol=0)
    for after, expected in zip(block.state, carried, strict=False):
        torch.testing.assert_close(after, expected.detach(), atol=1e-6, rtol=0)
    weights = torch.randn_like(looped)
    (grad_block,) = torch.autograd.grad((block.hidden * weights).sum(), x)
    (grad_loop,) = torch.autograd.grad((looped * weights).sum(), x)
    torch.testing.assert_close(grad_block, grad_loop, atol=1e-6, rtol=0)


def test_the_project_gru_is_torch_gru():
    """`GRULayers` replaces `torch.nn.GRU` for speed: a seed must draw the same weights under
    the same names, and the outputs, final state and gradients must be torch's."""
    torch.manual_seed(0)
    reference = torch.nn.GRU(8, 8, 2, batch_first=True)
    torch.manual_seed(0)
    ours = GRULayers(8, 2)
    assert list(ours.state_dict()) == list(reference.state_dict())
    for name, weight in reference.state_dict().items():
        assert torch.equal(ours.state_dict()[name], weight), name
    x, h = torch.randn(3, 7, 8, requires_grad=True), torch.randn(2, 3, 8)
    expected, ours_out = reference(x, h), ours(x, h)
    for got, want in zip(ours_out, expected, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    weights = torch.randn(3, 7, 8)
    grads = [
        torch.autograd.grad((out * weights).sum() + last.sum(), [x, *layers.parameters()])
        for layers, (out, last) in ((reference, expected), (ours, ours_out))
    ]
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_action_is_the_argmax_and_sampling_follows_the_policy():
    agent = make_agent("lstm").eval()
    obs = torch.zeros(4000, *OBS_SHAPE, dtype=torch.uint8)
    obs[:, 0, 0, 0] = 1
    start = torch.ones(4000, dtype=torch.bool)
    with torch.no_grad():
        agent.policy.bias.copy_(torch.tensor([1.0, 0.0, -1.0, 0.5]))
    state = agent.initial_state(4000)
    greedy, *_ = agent.act(obs, state, start, greedy=True)
    sampled, log_prob, _, out = agent.act(obs, state, start)
    logits = agent.policy(out.hidden)
    assert torch.equal(greedy, logits.argmax(-1))
    probs = torch.softmax(logits[0], -1)
    counts = torch.bincount(sampled, minlength=4).float() / len(sampled)
    torch.testing.assert_close(counts, probs, atol=0.03, rtol=0)
    torch.testing.assert_close(
        log_prob, torch.log_softmax(logits, -1).gather(-1, sampled[:, None]).squeeze(-1)
    )


def test_success_by_case_shows_one_lost_case_of_the_door_choice_and_how_it_is_lost():
    """An agent that takes the wrong door whenever the cue is blue and the good door north,
    and never takes one when the cue is red and the good door south, succeeds in half of its
    episodes; the cases say which quarters are lost, and which by the step limit."""
    rng = np.random.default_rng(0)
    cues, north = rng.integers(0, 2, 400), rng.integers(0, 2, 400).astype(bool)
    timed_out = (cues == 0) & ~north
    success = ~((cues == 1) & north) & ~timed_out
    rows = success_by_case(
        cues.tolist(), north.tolist(), success.tolist(), timed_out.tolist(), ("red", "blue")
    )
    cases = {(row["cue"], row["good_door"]): (row["success"], row["truncated"]) for row in rows}
    assert cases == {
        ("red", "north"): (1.0, 0.0),
        ("red", "south"): (0.0, 1.0),
        ("blue", "north"): (0.0, 0.0),
        ("blue", "south"): (1.0, 0.0),
    }
    assert sum(row["episodes"] for row in rows) == 400


def test_episodes_cut_by_the_step_limit_are_told_from_those_that_took_a_door():
    """Two Corridors of length 5 with a step limit of 8: one agent walks west forever and is
    cut at every 8th step; the other walks to the end and takes a door, and never is."""
    vec_env = gym.make_vec(
        "MazeBase/Corridor-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        min_length=5,
        max_length=5,
        max_steps=8,
    )
    stats = EpisodeStats(2, "corridor")
    vec_env.reset(seed=[0, 1])
    resetting, cut_by_env = np.zeros(2, dtype=bool), np.zeros(2, dtype=int)
    for t in range(45):  # (five episodes of 8 steps and a reset step each)
        west, east_then_north = 3, (1 if t % 6 < 5 else 0)
        _, reward, terminated, truncated, info = vec_env.step(np.array([west, east_then_north]))
        stats.record(reward, terminated, truncated, info, ~resetting)  # (next-step autoreset)
        resetting = terminated | truncated
        cut_by_env += truncated
    assert cut_by_env.tolist() == [5, 0]
    finished = stats.finished
    cut = [length == 8 for length in finished["episode_length"]]
    assert finished["truncated"] == [float(c) for c in cut] and sum(cut) == 5 < len(cut)
    assert all(s == 0 for s, c in zip(finished["success"], cut, strict=True) if c)
    assert stats.summary()["truncated"] == pytest.approx(5 / len(cut))


def test_kept_memories_outlive_their_span_and_only_those():
    """keep_new_memories (eval.keep_marked): the memory written at step 0 by environment 0 is
    given span L and is still seen 10 steps later; environment 1's has expired."""
    torch.manual_seed(0)
    cfg = MemoryConfig(
        kind="expire_span",
        dim=16,
        num_heads=2,
        ffn_dim=32,
        max_span=20,
        block_len=8,
        ramp=2,
        init_span_fraction=0.05,
    )  # e_i = 1
    core = MemoryTransformer(cfg).eval()
    with torch.inference_mode():
        out = core.step(torch.randn(2, 16), core.initial_state(2))
        keep_new_memories(out.state, torch.tensor([True, False]), cfg.max_span)
        state = out.state
        for _ in range(10):
            state = core.step(torch.randn(2, 16), state).state
    for layer, memory in zip(core.layers, state.layers, strict=True):
        slots = memory["recent"].view()
        seen = layer.kind.alive(slots, state.time, state.episode_begin) & (slots.position == 0)
        assert seen.any(1).tolist() == [True, False]


@pytest.mark.parametrize("count", [1, 5, 8, 12, 32])
def test_minibatches_are_as_many_as_configured_and_cover_every_sequence(count):
    """32 environments in 12 minibatches: 12 sets of 2 or 3 sequences (chunk gave 11)."""
    sets = minibatches(32, count)
    assert len(sets) == count
    if count == 1:
        assert sets == [slice(None)]
        return
    sizes = [len(index) for index in sets]
    assert max(sizes) - min(sizes) <= 1
    assert sorted(torch.cat(sets).tolist()) == list(range(32))


def test_span_drift_separates_a_moved_input_from_a_moved_predictor():
    cfg = MemoryConfig(dim=8, max_span=100, init_span_fraction=0.5)
    first, second = SpanPredictor(cfg), SpanPredictor(cfg)
    with torch.no_grad():
        first.linear.weight.fill_(0.5)
        second.linear.weight.fill_(0.5)
        second.linear.bias.fill_(-1.0)
    h = torch.randn(5, 8)
    moved = h + 0.3
    [only_predictor] = drift_split([first, second], [h, h])
    assert only_predictor["by_input"] == 0
    assert only_predictor["by_predictor"] == pytest.approx(
        (second(h) - first(h)).mean().item(), abs=1e-5
    )
    assert only_predictor["span_after"] - only_predictor["span_before"] == pytest.approx(
        only_predictor["by_predictor"], abs=1e-4
    )
    [only_input] = drift_split([first, first], [h, moved])
    assert only_input["by_predictor"] == 0
    assert only_input["by_input"] == pytest.approx(
        (first(moved) - first(h)).mean().item(), abs=1e-5
    )
    assert only_input["by_input"] > 0  # w.(h + 0.3) = w.h + 1.2


def test_module_swap_groups_cover_the_agent_and_swap_only_their_own_parameters():
    """Each layer's attention, memory kind and FFN (norms with their block), the encoder and
    the heads; swapping every group in turn moves each parameter exactly once."""
    before = make_agent("expire_span").state_dict()
    after = {name: value + 1 for name, value in before.items()}
    groups = module_groups(before)
    assert groups == [
        "encoder",
        "core.layers.0.attention",
        "core.layers.0.kind",
        "core.layers.0.ffn",
        "core.layers.1.attention",
        "core.layers.1.kind",
        "core.layers.1.ffn",
        "core.final_norm",
        "policy",
        "value",
    ]
    assert module_group("core.layers.1.attention_norm.bias") == "core.layers.1.attention"
    assert module_group("core.layers.0.kind.predictor.linear.weight") == "core.layers.0.kind"
    moved = {name: 0 for name in before}
    for group in groups:
        mixed = swapped(before, after, group)
        for name, value in mixed.items():
            if value is after[name]:
                moved[name] += 1
            else:
                assert value is before[name]
    assert set(moved.values()) == {1}


def test_success_by_length_has_one_bin_per_length_when_bins_outnumber_lengths():
    rows = success_by_length([3, 4, 4, 5], [1, 0, 1, 1], low=3, high=5, bins=5)
    assert [(row["lengths"], row["episodes"], row["success"]) for row in rows] == [
        ("3-3", 1, 1.0),
        ("4-4", 2, 0.5),
        ("5-5", 1, 1.0),
    ]
    halves = success_by_length([3, 4, 10], [1, 0, 1], low=3, high=10, bins=2)
    assert [row["lengths"] for row in halves] == ["3-6", "7-10"]


CORRIDOR = {"name": "corridor", "id": "MazeBase/Corridor-v0", "min_length": 3, "max_length": 8}


def decided_agent(env_cfg, action: int) -> ActorCritic:
    """An Expire-Span agent whose policy puts all but e^-100 of its probability on ``action``,
    whatever it sees."""
    single = make_env(env_cfg)
    core = MemoryTransformer(MemoryConfig(kind="expire_span", dim=16, num_heads=2, max_span=8))
    agent = ActorCritic(single.observation_space, single.action_space, core, 16)
    single.close()
    with torch.no_grad():
        agent.policy.weight.zero_()
        agent.policy.bias.fill_(-50.0)[action] = 50.0
    return agent


@pytest.mark.parametrize("action", [0, 1])  # up: into the cue's cell; right: to the east wall
def test_evaluation_counts_moves_into_walls_and_lengths_against_the_shortest_path(action):
    """An agent that always prefers one move, by either policy: every episode is cut at the
    step limit (20), and the share of steps whose most likely move is blocked is 1 for a move
    into the cue beside the start, and for a move east all steps but the corridor's length - 1
    it walks (the shortest path is the corridor's length)."""
    env_cfg = OmegaConf.create({**CORRIDOR, "max_steps": 20})
    eval_cfg = OmegaConf.create(
        {"episodes": 12, "num_envs": 4, "policy": "both", "probe_word": "cue"}
    )
    eval_cfg.update(keep_marked=False, length_bins=2)
    result = evaluate_policies(decided_agent(env_cfg, action), env_cfg, eval_cfg, seed=0)
    assert list(result) == ["greedy", "sampled"]
    for outcome in result.values():
        assert outcome["episodes"] == 12 and outcome["success"] == 0
        assert outcome["truncated"] == 1 and outcome["episode_length"] == 20
        length = outcome["corridor_length"]
        assert outcome["length_ratio"] == pytest.approx(20 / length)
        walked = 0 if action == 0 else length - 1
        assert outcome["blocked_likely"] == pytest.approx(1 - walked / 20)


def test_hesitation_places_each_step_and_counts_the_steps_spent_there():
    """An agent that always moves east: one step at the start, one at each cell between
    (dwell 0), then it waits at the east end until the step limit (20), its most likely move
    blocked there and nowhere else; its probabilities are those of the decided policy."""
    env_cfg = OmegaConf.create({**CORRIDOR, "max_steps": 20})
    rows = hesitation(decided_agent(env_cfg, 1), env_cfg, episodes=8, greedy=False, seed=0)
    by_place = {}
    for row in rows:
        by_place.setdefault(row["place"], []).append(row)
        assert row["right"] == pytest.approx(1.0)
        assert row["blocked_likely"] == (1.0 if row["place"] == "end" else 0.0)
    assert [row["dwell"] for row in by_place["start"]] == ["0"]
    assert [row["dwell"] for row in by_place["corridor"]] == ["0"]
    first = by_place["start"][0]["steps"]  # (episodes begun: each starts at the start cell)
    assert first >= 8 and by_place["corridor"][0]["steps"] >= first  # lengths 3..8: 1+ between
    ends = [row for row in by_place["end"] if row["dwell"] == "5+"]
    assert {row["case"].split(",")[0] for row in ends} <= {"red cue", "blue cue"}
    waited = sum(row["steps"] for row in by_place["end"])  # 20 - (length - 1) per episode
    assert waited > sum(row["steps"] for row in by_place["corridor"])
