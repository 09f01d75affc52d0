"""Losses of the two learners: advantage actor-critic (the paper's) and PPO.

Both work on one unroll of T steps for B environments, laid out (B, T).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def generalized_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    bootstrap_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE (Schulman et al. 2016) over an unroll; `dones[:, t]` marks an episode that ended
    with step t. With gae_lambda = 1 the advantages are the n-step returns of advantage
    actor-critic minus the values. Returns (advantages, value targets), both (B, T)."""
    advantages = torch.zeros_like(rewards)
    next_advantage = torch.zeros_like(bootstrap_value)
    next_value = bootstrap_value
    for t in reversed(range(rewards.shape[1])):
        not_done = 1.0 - dones[:, t]
        delta = rewards[:, t] + gamma * next_value * not_done - values[:, t]
        next_advantage = delta + gamma * gae_lambda * not_done * next_advantage
        advantages[:, t] = next_advantage
        next_value = values[:, t]
    return advantages, advantages + values


def _log_prob_and_entropy(
    logits: torch.Tensor, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = F.log_softmax(logits, dim=-1)
    taken = log_probs.gather(-1, actions[..., None]).squeeze(-1)
    return taken, -(log_probs.exp() * log_probs).sum(-1)


@dataclass
class LossTerms:
    policy: torch.Tensor
    value: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor | None = None  # PPO: KL(behaviour || current policy), no gradient

    def total(self, value_coef: float, entropy_coef: float) -> torch.Tensor:
        return self.policy + value_coef * self.value - entropy_coef * self.entropy


def actor_critic_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
) -> LossTerms:
    """Advantage actor-critic: -log pi(a|s) A, squared value error, entropy bonus."""
    taken, entropy = _log_prob_and_entropy(logits, actions)
    return LossTerms(
        policy=-(taken * advantages).mean(),
        value=0.5 * (returns - values).pow(2).mean(),
        entropy=entropy.mean(),
    )


def normalised(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages with zero mean and unit standard deviation, taken over the whole unroll
    before it is split into minibatches: a minibatch holds only a few long episodes, and
    its own statistics would swing with how many of them happen to end in it."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def ppo_loss(
    logits: torch.Tensor,
    values: torch.Tensor,
    actions: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    clip: float,
) -> LossTerms:
    """PPO's clipped surrogate (Schulman et al. 2017); train_rl.py passes advantages
    ``normalised`` over the unroll."""
    taken, entropy = _log_prob_and_entropy(logits, actions)
    log_ratio = taken - old_log_probs
    ratio = log_ratio.exp()
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    return LossTerms(
        policy=-surrogate.mean(),
        value=0.5 * (returns - values).pow(2).mean(),
        entropy=entropy.mean(),
        approx_kl=((ratio - 1) - log_ratio).mean().detach(),  # the k3 estimator: unbiased, >= 0
    )
