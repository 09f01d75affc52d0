"""The learner: updates an agent from an unroll by PPO or A2C (`Learner`)."""

from __future__ import annotations

from typing import Any

import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from agents.actor_critic import ActorCritic
from agents.anchor import PolicyAnchor
from agents.distributions import policy_kl
from agents.encoders import map_observation, update_statistics
from agents.losses import (
    LossTerms,
    actor_critic_loss,
    behaviour_ratio_error,
    generalized_advantages,
    masked_mean,
    normalised,
    ppo_loss,
)
from agents.rollout import Unroll
from memory import MemoryState
from training.distributed import DistInfo, all_reduce_mean
from training.schedule import lr_fraction

ALL = slice(None)
OPTIMIZERS = ("rmsprop", "adam", "amsgrad")


def make_optimizer(agent: torch.nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    """RMSProp, Adam or Adam with AMSGrad (one of OPTIMIZERS) over the agent's parameters."""
    if name == "rmsprop":
        return torch.optim.RMSprop(agent.parameters(), lr=lr, eps=1e-5, foreach=True)
    # fused: one kernel for all parameters, four times faster than a loop over them on a CPU
    return torch.optim.Adam(
        agent.parameters(), lr=lr, eps=1e-5, amsgrad=name == "amsgrad", fused=True
    )


def clip_gradients(parameters: list[torch.nn.Parameter], max_norm: float) -> None:
    """Scales the gradients of ``parameters`` (on one device) down to a total 2-norm of at most
    ``max_norm``: `torch.nn.utils.clip_grad_norm_`'s arithmetic, without its move of each
    tensor's norm to the first one's device (an operation per parameter)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))


def minibatches(batch_size: int, count: int, device: torch.device | str = "cpu") -> list:
    """``count`` random disjoint sets of whole environment sequences (each keeps its own
    memory), of sizes that differ by at most one, as indices on ``device`` (so that selecting
    a minibatch on a GPU does not wait for it); [ALL] for one."""
    if count == 1:
        return [ALL]
    return list(torch.randperm(batch_size).to(device).tensor_split(count))


LOSS_KEYS = ("policy_loss", "value_loss", "entropy", "aux_loss", "anchor_kl")
# The largest |pi_learner / pi_acting - 1| of an unroll's first minibatch, before its first
# update: 0 up to float error when the learner starts from the policy that acted.
BEHAVIOUR_RATIO_ERROR = "behaviour_ratio_error"


def learner_loss(
    agent_cfg: DictConfig, policy, values, actions, old_log_probs, advantages, returns, mask
) -> LossTerms:
    if agent_cfg.name == "ppo":
        clip = agent_cfg.clip
        return ppo_loss(policy, values, actions, old_log_probs, advantages, returns, clip, mask)
    return actor_critic_loss(policy, values, actions, advantages, returns, mask)


def select_envs(obs: Any, index: Any) -> Any:
    """obs[index]: the observations of some environments (a minibatch)."""
    return map_observation(lambda x: x[index], obs)


class Learner:
    """Updates ``agent`` from unrolls by PPO or A2C (the ``agent.*`` settings, ``cfg``):
    advantages and value targets by GAE, the learning rate's schedule over ``num_updates``,
    epochs over minibatches of whole environment sequences in block mode, and the KL anchor to
    the best policy (`PolicyAnchor`, ``agent.anchor_coef``). Under torchrun the gradients flow
    through a DistributedDataParallel wrapper, and the ranks stop their epochs together.
    With ``compile_mode`` (a torch.compile mode) the minibatches' forward and backward run
    compiled, from start memories of few shapes (`memory.MemoryState.select`)."""

    def __init__(
        self,
        agent: ActorCritic,
        cfg: DictConfig,
        num_updates: int,
        dist: DistInfo,
        compile_mode: str | None = None,
    ) -> None:
        self.agent, self.cfg, self.num_updates, self.dist = agent, cfg, num_updates, dist
        self.model = (  # what the gradients flow through: the agent itself in one process
            DistributedDataParallel(agent, broadcast_buffers=False)
            if dist.world_size > 1
            else agent
        )
        self.fixed_shapes = bool(compile_mode)
        if compile_mode:  # static shapes: each padded length compiles once
            self.model = torch.compile(self.model, mode=compile_mode, dynamic=False)
        self.optimizer = make_optimizer(agent, cfg.optimizer, cfg.lr)
        self.parameters = list(agent.parameters())
        self.anchor = PolicyAnchor(agent, cfg.anchor_from) if cfg.anchor_coef else None

    @property
    def anchored(self) -> bool:
        return self.anchor is not None and self.anchor.active

    def targets(self, unroll: Unroll) -> tuple[torch.Tensor, torch.Tensor]:
        """The unroll's advantages (PPO: `normalised` over the unroll) and value targets."""
        advantages, returns = generalized_advantages(
            unroll.rewards,
            unroll.values,
            unroll.dones,
            unroll.bootstrap_value,
            self.cfg.gamma,
            self.cfg.gae_lambda,
            unroll.truncation_values,
        )
        if self.cfg.name == "ppo":
            advantages = normalised(
                advantages, returns, unroll.rewards, self.cfg.advantage_scale, unroll.mask
            )
        return advantages, returns

    def start_states(self, unroll: Unroll, indices: list) -> list:
        """The memory each minibatch of ``indices`` starts from: the unroll's, selected for it
        (a memory transformer's lengths read at once for the epoch), or padded to few shapes
        for a compiled learner."""
        start = unroll.start_state
        if indices[0] is ALL and not self.fixed_shapes:
            return [start]
        if isinstance(start, MemoryState) and not self.fixed_shapes:
            return start.minibatches(indices)
        return [start.select(index, self.fixed_shapes) for index in indices]

    def update(self, unroll: Unroll, update: int) -> dict[str, float]:
        """Learns from ``unroll``, the ``update``-th (0-based); returns the means over its
        minibatches of the losses, the KL of its last epoch (PPO: KL(acting || current
        policy); 0 for A2C), the epochs run (fewer than agent.epochs when agent.target_kl
        stopped them) and the behaviour ratio error."""
        cfg, device = self.cfg, unroll.rewards.device
        self.agent.train()
        advantages, returns = self.targets(unroll)
        mask = unroll.mask
        previous = unroll.previous()
        fraction = lr_fraction(cfg.lr_schedule, update, self.num_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr * fraction
        if self.anchored:  # the anchor's policy on the whole unroll, once, from its own memory
            anchor_policy = self.anchor.policy(unroll.obs, unroll.starts, previous)
        losses = torch.zeros(len(LOSS_KEYS), device=device)  # summed without a sync
        no_anchor = torch.zeros((), device=device)
        epochs_run, minibatches_run, ratio_error = 0, 0, 0.0
        for _ in range(cfg.epochs):
            epochs_run, epoch_kl = epochs_run + 1, 0.0
            indices = minibatches(unroll.rewards.shape[0], cfg.minibatches, device)
            for index, start in zip(indices, self.start_states(unroll, indices), strict=True):
                policy, values, out = self.model(
                    select_envs(unroll.obs, index),
                    start,
                    unroll.starts[index],
                    (previous[0][index], previous[1][index]),
                    next_state=False,
                )
                actions, old_log_probs = unroll.actions[index], unroll.log_probs[index]
                minibatch_mask = None if mask is None else mask[index]
                if minibatches_run == 0:  # before the unroll's first optimiser step
                    ratio_error = behaviour_ratio_error(
                        policy, actions, old_log_probs, minibatch_mask
                    )
                terms = learner_loss(
                    cfg,
                    policy,
                    values,
                    actions,
                    old_log_probs,
                    advantages[index],
                    returns[index],
                    minibatch_mask,
                )
                loss = terms.total(cfg.value_coef, cfg.entropy_coef) + out.aux_loss
                anchor_kl = no_anchor
                if self.anchored:
                    reference = select_envs(anchor_policy, index)
                    anchor_kl = masked_mean(policy_kl(policy, reference), minibatch_mask)
                    loss = loss + cfg.anchor_coef * anchor_kl
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.max_grad_norm:
                    clip_gradients(self.parameters, cfg.max_grad_norm)
                self.optimizer.step()
                minibatches_run += 1
                with torch.no_grad():
                    terms_of_loss = (terms.policy, terms.value, terms.entropy, out.aux_loss)
                    losses += torch.stack((*terms_of_loss, anchor_kl))
                if terms.approx_kl is not None:  # (no gradient)
                    epoch_kl += terms.approx_kl / cfg.minibatches  # no sync
            # PPO: stop this unroll's epochs once the policy is target_kl away from the one
            # that acted (decided on the mean over ranks, so that all ranks stop together).
            target_kl = cfg.get("target_kl")
            if target_kl and all_reduce_mean({"kl": float(epoch_kl)}, self.dist)["kl"] > target_kl:
                break
        # The observation statistics move after the update, so each unroll is normalised alike
        # by acting and learning.
        update_statistics(self.agent.encoder, unroll.obs)
        means = {
            key: value / minibatches_run
            for key, value in zip(LOSS_KEYS, losses.tolist(), strict=True)
        }
        means.update(approx_kl=float(epoch_kl), epochs=epochs_run)
        means[BEHAVIOUR_RATIO_ERROR] = ratio_error
        return means

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries of the learner: the agent, the optimiser, the anchor."""
        state = {"agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.anchored:
            state["anchor"] = self.anchor.state_dict()
        return state

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        self.agent.load_state_dict(checkpoint["agent"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.anchor is not None and "anchor" in checkpoint:
            self.anchor.load_state_dict(checkpoint["anchor"])
