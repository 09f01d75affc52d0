"""Losses of the two learners, advantage actor-critic (the paper's) and PPO, and what they are
made of: advantages, masked means and the behaviour check.

All work on one unroll of T steps for B environments, laid out (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agents.distributions import PolicyParams, log_prob_and_entropy


def generalized_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    bootstrap_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
    truncation_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) over an unroll; `dones[:, t]` marks an episode that ended
    with step t. With gae_lambda = 1 the advantages are the n-step returns of advantage
    actor-critic minus the values. ``truncation_values[:, t]``: the value of the final
    observation of an episode that a step limit ended with step t (0 elsewhere), which that
    step bootstraps from: delta_t = r_t + gamma V(final) - V_t. Returns (advantages, value
    targets), both (B, T)."""
    not_done = 1.0 - dones
    next_values = torch.cat([values[:, 1:], bootstrap_value[:, None]], 1)
    deltas = rewards + gamma * next_values * not_done - values
    if truncation_values is not None:
        deltas = deltas + gamma * truncation_values
    decays = gamma * gae_lambda * not_done
    advantage, backwards = torch.zeros_like(bootstrap_value), []
    for delta, decay in zip(deltas.unbind(1)[::-1], decays.unbind(1)[::-1], strict=True):
        advantage = delta + decay * advantage  # the only step-by-step part: two operations
        backwards.append(advantage)
    advantages = torch.stack(backwards[::-1], 1)
    return advantages, advantages + values


def masked_mean(x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """The mean of ``x`` over the entries where ``mask`` (bool, x's shape) is True; all of
    them for None."""
    if mask is None:
        return x.mean()
    return (x * mask).sum() / mask.sum().clamp_min(1)


def behaviour_ratio_error(
    policy: PolicyParams, actions: torch.Tensor, behaviour_log_probs: torch.Tensor, mask
) -> float:
    """max |pi(a|s) / pi_behaviour(a|s) - 1| over the samples (``mask``: those whose action was
    taken), for ``policy``: 0 up to float error when it is the policy that
    acted, as it must be before an unroll's first update."""
    with torch.no_grad():
        taken, _ = log_prob_and_entropy(policy, actions)
        error = (taken - behaviour_log_probs).exp().sub(1).abs()
        if mask is not None:
            error = error[mask]
        return float(error.max()) if error.numel() else 0.0


@dataclass
class LossTerms:
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor | None = None  # PPO: KL(behaviour || current policy), no gradient

    def total(self, value_coef: float, entropy_coef: float) -> torch.Tensor:
        return self.policy + value_coef * self.value - entropy_coef * self.entropy


def actor_critic_loss(
    policy: PolicyParams,
    values: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> LossTerms:
    """Advantage actor-critic: -log pi(a|s) A, squared value error, entropy bonus; means over
    the samples of ``mask`` (None: all)."""
    taken, entropy = log_prob_and_entropy(policy, actions)
    return LossTerms(
        policy=-masked_mean(taken * advantages, mask),
        value=0.5 * masked_mean((returns - values).pow(2), mask),
        entropy=masked_mean(entropy, mask),
    )


ADVANTAGE_SCALES = ("std", "returns", "none")


def normalised(
    advantages: torch.Tensor,
    returns: torch.Tensor,
    rewards: torch.Tensor,
    scale: str = "std",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Advantages with zero mean, divided by a scale, both taken over the whole unroll (the
    samples of ``mask``, None: all) before it is split into minibatches (a minibatch holds
    only a few long episodes, and its own statistics would swing with how many of them happen
    to end in it). ``scale``:

    - "std": their standard deviation (unit-scale updates at every stage of learning);
    - "returns": the root mean square of the value targets ``returns``, i.e. advantages in
      units of the task's returns. Once a task is solved the advantages are value noise of
      tiny spread, which "std" would blow up to the size of the updates that learned it,
      while the returns keep their size. An unroll whose ``rewards`` are all zero is only
      centred: its returns are value noise too, and dividing by them would turn that noise
      into updates the size of learning ones, which move the policy before any reward does;
    - "none": centred only.
    """
    if mask is not None:
        advantages, returns, rewards = advantages[mask], returns[mask], rewards[mask]
        return advantages.new_zeros(mask.shape).masked_scatter(
            mask, normalised(advantages, returns, rewards, scale)
        )
    centred = advantages - advantages.mean()
    if scale == "std":
        return centred / advantages.std().clamp_min(1e-8)
    if scale == "returns":  # (a tensor condition: no wait for the device)
        rms = returns.square().mean().sqrt().clamp_min(1e-8)
        return centred / torch.where(rewards.ne(0).any(), rms, torch.ones_like(rms))
    return centred


def ppo_loss(
    policy: PolicyParams,
    values: torch.Tensor,
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    clip: float,
    mask: torch.Tensor | None = None,
) -> LossTerms:
    """PPO's clipped surrogate (Schulman et al. 2017); train_rl.py passes advantages
    ``normalised`` over the unroll. Means over the samples of ``mask`` (None: all)."""
    taken, entropy = log_prob_and_entropy(policy, actions)
    log_ratio = taken - old_log_probs
    ratio = log_ratio.exp()
    unclipped, clipped = ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages
    # their minimum; at a tie the clipped one takes the whole gradient that torch.min would
    # split between the two (the same: at a tie the ratio is within the clip or the
    # advantage is 0)
    surrogate = torch.where(unclipped < clipped, unclipped, clipped)
    k3 = (ratio - 1) - log_ratio  # the k3 estimator of KL: unbiased, >= 0
    return LossTerms(
        policy=-masked_mean(surrogate, mask),
        value=0.5 * masked_mean((returns - values).pow(2), mask),
        entropy=masked_mean(entropy, mask),
        approx_kl=masked_mean(k3, mask).detach(),
    )
