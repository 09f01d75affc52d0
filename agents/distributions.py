"""The policy's distributions over actions, by action space: a categorical over Discrete
actions (its logits, (..., A)), independent categoricals over MultiDiscrete components (a
tuple of logits, one per component), and a diagonal Gaussian over Box actions (`Gaussian`).
Sampling (from random numbers drawn apart, `sampling_noise`), log-probabilities, entropies and
KL divergences for each."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from gymnasium import spaces

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


@dataclass
class Gaussian:
    """A diagonal Gaussian: mean (..., A) and log standard deviation (..., A)."""

    mean: torch.Tensor
    log_std: torch.Tensor

    def __getitem__(self, index: Any) -> Gaussian:
        """The distributions of the batch elements ``index`` (e.g. a minibatch)."""
        return Gaussian(self.mean[index], self.log_std[index])


# What a policy head outputs: logits (Discrete), one logits tensor per component
# (MultiDiscrete) or a Gaussian (Box).
PolicyParams = torch.Tensor | tuple[torch.Tensor, ...] | Gaussian


# The random numbers a sample is drawn from: uniform in [0, 1) per logit of a categorical
# (Gumbel-max), one such tensor per MultiDiscrete component, a standard normal per dimension of a
# Gaussian. None: the most likely action (a Gaussian's mean).
Noise = torch.Tensor | tuple[torch.Tensor, ...] | None


def sampling_noise(
    space: spaces.Space, batch: int, dtype: torch.dtype, device: torch.device | str
) -> Noise:
    """The random numbers `sample` draws ``batch`` actions of ``space`` from, drawn before the
    policy is computed so that a compiled step can sample inside it from the same numbers."""
    if isinstance(space, spaces.Box):
        return torch.randn(batch, space.shape[0], dtype=dtype, device=device)
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(torch.rand(batch, int(n), dtype=dtype, device=device) for n in space.nvec)
    return torch.rand(batch, int(space.n), dtype=dtype, device=device)


def most_likely_where(space: spaces.Space, noise: Noise, rows: torch.Tensor) -> Noise:
    """The noise `sampling_noise` drew for ``space``, with its rows ``rows`` ((B,) bool) set
    to the numbers from which `sample` draws the most likely action: a Gaussian's 0 (its
    mean), a categorical's u = 1/e, whose Gumbel noise -log(-log u) is 0. The other rows keep
    their numbers, so the random streams are those of a batch that samples every action."""
    if isinstance(noise, tuple):
        return tuple(torch.where(rows[:, None], math.exp(-1), part) for part in noise)
    most_likely = 0.0 if isinstance(space, spaces.Box) else math.exp(-1)
    return torch.where(rows[:, None], most_likely, noise)


def sample(policy: PolicyParams, noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
    """An action of each batch element, drawn from ``noise`` (`sampling_noise`; None: the most
    likely action, a Gaussian's mean), and its log-probability (density, for Box); for
    MultiDiscrete one action per component, stacked on the last dimension, whose
    log-probabilities add up."""
    if isinstance(policy, Gaussian):
        action = policy.mean
        if noise is not None:
            action = action + policy.log_std.exp() * noise
        return action, gaussian_log_prob(policy, action)
    if isinstance(policy, tuple):
        noises = [None] * len(policy) if noise is None else noise
        parts = [sample(part, n) for part, n in zip(policy, noises, strict=True)]
        return torch.stack([action for action, _ in parts], dim=-1), sum(lp for _, lp in parts)
    log_probs = F.log_softmax(policy, dim=-1)
    if noise is None:
        action = policy.argmax(dim=-1)
    else:  # Gumbel-max sampling: cheaper than torch.multinomial for small batches
        gumbel = torch.log(-torch.log(noise.clamp(min=1e-20)))  # (minus the Gumbel noise)
        action = (log_probs - gumbel).argmax(dim=-1)
    return action, log_probs.gather(-1, action[..., None]).squeeze(-1)


def gaussian_log_prob(policy: Gaussian, actions: torch.Tensor) -> torch.Tensor:
    """The density's log at ``actions``, summed over the independent dimensions."""
    z = (actions - policy.mean) * torch.exp(-policy.log_std)
    return (-0.5 * z.square() - policy.log_std - LOG_SQRT_2PI).sum(-1)


def log_prob_and_entropy(
    policy: PolicyParams, actions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability (density, for Box) of ``actions`` and the policy's entropy. The
    components of a MultiDiscrete action (``actions`` (..., components)) and the dimensions
    of a Box action are independent: both add up over them."""
    if isinstance(policy, Gaussian):
        log_prob = gaussian_log_prob(policy, actions)
        entropy = (0.5 + LOG_SQRT_2PI + policy.log_std).sum(-1)
        return log_prob, entropy.expand_as(log_prob)
    if isinstance(policy, tuple):
        parts = [log_prob_and_entropy(part, actions[..., i]) for i, part in enumerate(policy)]
        return sum(taken for taken, _ in parts), sum(entropy for _, entropy in parts)
    log_probs = F.log_softmax(policy, dim=-1)
    taken = log_probs.gather(-1, actions[..., None]).squeeze(-1)
    return taken, -(log_probs.exp() * log_probs).sum(-1)


def policy_kl(policy: PolicyParams, reference: PolicyParams) -> torch.Tensor:
    """KL(policy || reference) at each state; summed over the components of MultiDiscrete
    actions and the dimensions of Box actions."""
    if isinstance(policy, Gaussian):
        log_ratio = reference.log_std - policy.log_std
        spread = (policy.log_std - reference.log_std).mul(2).exp()  # sigma_p^2 / sigma_q^2
        shift = ((policy.mean - reference.mean) * torch.exp(-reference.log_std)).square()
        return (log_ratio + 0.5 * (spread + shift) - 0.5).sum(-1)
    if isinstance(policy, tuple):
        return sum(policy_kl(part, ref) for part, ref in zip(policy, reference, strict=True))
    log_p, log_q = F.log_softmax(policy, dim=-1), F.log_softmax(reference, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def kl_from_uniform(policy: PolicyParams) -> torch.Tensor:
    """KL(uniform || policy) at each state, summed over the components of MultiDiscrete
    actions: minus the mean log-probability of the actions, less its value at the uniform
    policy. Its gradient on a categorical's logits is the probabilities less uniform's, which
    stays large where the policy is saturated (the entropy's vanishes there)."""
    if isinstance(policy, Gaussian):
        raise ValueError("a KL from the uniform policy needs Discrete or MultiDiscrete actions")
    if isinstance(policy, tuple):
        return sum(kl_from_uniform(part) for part in policy)
    log_probs = F.log_softmax(policy, dim=-1)
    return -log_probs.mean(-1) - math.log(policy.shape[-1])
