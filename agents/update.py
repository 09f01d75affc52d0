"""The learner: updates an agent from an unroll by PPO or A2C (`Learner`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from omegaconf import DictConfig
from torch.nn.parallel import DistributedDataParallel

from agents.actor_critic import ActorCritic, Previous
from agents.anchor import PolicyAnchor
from agents.distributions import PolicyParams, kl_from_uniform, policy_kl
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
from memory import CoreOutput, MemoryState
from training.distributed import DistInfo, all_reduce_mean
from training.schedule import coef_fraction, lr_fraction

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


LOSS_KEYS = ("policy_loss", "value_loss", "entropy", "aux_loss", "anchor_kl", "cut_kl")
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


class Minibatch(NamedTuple):
    """What one gradient step learns from: some environments of an unroll, laid out (B, T)."""

    obs: Any
    starts: torch.Tensor  # episode starts
    previous: Previous
    actions: torch.Tensor
    log_probs: torch.Tensor  # the acting policy's, of the actions
    advantages: torch.Tensor
    returns: torch.Tensor  # the value targets
    mask: torch.Tensor | None  # the samples the losses count (None: all)
    anchor: PolicyParams | None  # the anchor's policy (None: no anchor)
    cut: torch.Tensor | None  # steps of episodes a step limit cut (None: not used)
    start: Any  # the memory they start from

    def select(self, index: Any, start: Any) -> Minibatch:
        """The environments ``index`` of this batch, which start from the memory ``start``
        (a memory is selected apart, `Learner.start_states`)."""
        *fields, _ = self
        return Minibatch(*(None if x is None else select_envs(x, index) for x in fields), start)


class Tally:
    """What an update reports, summed on the device over its minibatches (`add`), so that
    only `means` reads the device."""

    def __init__(self, device: torch.device, minibatches: int) -> None:
        self.losses = torch.zeros(len(LOSS_KEYS), device=device)  # LOSS_KEYS' sums
        self.zero = torch.zeros((), device=device)  # a term the learner does not have
        self.minibatches = minibatches  # an epoch's
        self.steps, self.epochs = 0, 0
        self.epoch_kl: torch.Tensor | float = 0.0  # the mean over this epoch's minibatches
        self.ratio_error = 0.0  # (`BEHAVIOUR_RATIO_ERROR`)

    def start_epoch(self) -> None:
        self.epochs += 1
        self.epoch_kl = 0.0

    def add(self, terms: LossTerms, *penalties: torch.Tensor | None) -> None:
        """One gradient step's loss terms (`Learner.gradient_step`): the learner's, then the
        auxiliary loss and the KLs (None: not in this learner's loss)."""
        self.steps += 1
        penalties = tuple(self.zero if term is None else term for term in penalties)
        with torch.no_grad():
            self.losses += torch.stack((terms.policy, terms.value, terms.entropy, *penalties))
        if terms.approx_kl is not None:  # (no gradient)
            self.epoch_kl += terms.approx_kl / self.minibatches  # no sync

    def means(self) -> dict[str, float]:
        """The losses' means over the steps, the last epoch's KL, the epochs run and the
        behaviour ratio error."""
        sums = self.losses.tolist()
        means = {key: value / self.steps for key, value in zip(LOSS_KEYS, sums, strict=True)}
        means.update(approx_kl=float(self.epoch_kl), epochs=self.epochs)
        means[BEHAVIOUR_RATIO_ERROR] = self.ratio_error
        return means


class Learner:
    """Updates ``agent`` from unrolls by PPO or A2C (the ``agent.*`` settings, ``cfg``):
    advantages and value targets by GAE, the learning rate's schedule over ``num_updates``,
    epochs over minibatches of whole environment sequences in block mode, and the KL anchor to
    the best policy (`PolicyAnchor`, ``agent.anchor_coef``); once that anchor holds, a pull
    towards the uniform policy on the steps of episodes a step limit cut
    (``agent.cut_uniform_coef``): a solved policy saturated on a move that loops gets no
    gradient from the return, whose gradient on a saturated action's logit is 1 - p, nor from
    the entropy, whose gradient vanishes there (``agent.greedy_envs`` of the envs then act
    greedily, for that pull alone); and once it holds, the memory's span penalty
    at ``agent.held_aux_loss_coef`` and its attended pull at
    ``agent.held_attended_span_coef``. Under torchrun the gradients flow
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
        self.anchor = None
        if cfg.anchor_coef:
            self.anchor = PolicyAnchor(agent, cfg.anchor_from, cfg.anchor_follows, cfg.anchor_after)
        self.anchor_coef = cfg.anchor_coef  # (both set by set_rate for each update)
        self.entropy_coef = cfg.entropy_coef

    @property
    def anchored(self) -> bool:
        return self.anchor is not None and self.anchor.active

    def greedy_envs(self, num_envs: int) -> torch.Tensor | None:
        """Which of the ``num_envs`` envs act by their most likely action in the next unroll
        (agent.greedy_envs): once an anchor holds, the last few, whose steps only the pull out
        of loops learns from, so that it also pulls on a loop that only the greedy policy
        makes (sampling escapes it, so no sampled episode is cut); None: none."""
        if not (self.cfg.greedy_envs and self.anchored):
            return None
        greedy = torch.zeros(num_envs, dtype=torch.bool, device=self.parameters[0].device)
        greedy[num_envs - self.cfg.greedy_envs :] = True
        return greedy

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

    def start_states(self, start: Any, indices: list) -> list:
        """The memory each minibatch of ``indices`` starts from: the unroll's, ``start``,
        selected for it (a memory transformer's lengths read at once for the epoch), or padded
        to few shapes for a compiled learner."""
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
        self.agent.train()
        self.set_rate(update)
        whole = self.whole_unroll(unroll)
        tally = Tally(unroll.rewards.device, self.cfg.minibatches)
        for _ in range(self.cfg.epochs):
            tally.start_epoch()
            for batch in self.epoch(whole):
                policy, values, out = self.forward(batch)
                if tally.steps == 0:  # before the unroll's first optimiser step
                    tally.ratio_error = behaviour_ratio_error(
                        policy, batch.actions, batch.log_probs, batch.mask
                    )
                tally.add(*self.gradient_step(batch, policy, values, out))
            if self.kl_stops(tally.epoch_kl):
                break
        # The observation statistics move after the update, so each unroll is normalised alike
        # by acting and learning.
        update_statistics(self.agent.encoder, unroll.obs)
        return tally.means()

    def set_rate(self, update: int) -> None:
        """The learning rate of the ``update``-th update, as agent.lr_schedule sets it, the
        anchor's and the entropy cost's coefficients, as agent.anchor_schedule and
        agent.entropy_schedule set them."""
        fraction = lr_fraction(self.cfg.lr_schedule, update, self.num_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = self.cfg.lr * fraction
        # agent.anchor_schedule=rate: the anchor holds hardest while the updates are large
        holding = coef_fraction(self.cfg.anchor_schedule, fraction)
        if self.cfg.anchor_schedule == "rate":  # agent.anchor_until: let go once the rate has
            # fallen by that much of its peak, so that the last updates learn from the return alone
            letting_go = max(0.0, 1 - (1 - holding) / self.cfg.anchor_until)
            # ... unless the policy has since fallen below anchor_from: then the anchor (the last
            # agent that held) pulls it back, as hard as the rate alone would have it
            lapsed = letting_go == 0 and self.anchored and not self.anchor.held
            holding = holding if lapsed else letting_go
        self.anchor_coef = self.cfg.anchor_coef * holding
        # agent.held_aux_loss_coef: once the task is solved (an anchor holds), the span penalty
        # takes this alpha, so that the attended pull on the cue's span, which the predictor
        # carries to every memory, no longer grows the memory of a solved policy (a memory
        # without the penalty or the pull ignores its weight, as it ignores memory.*'s)
        core = self.agent.core
        if self.cfg.held_aux_loss_coef is not None and self.anchored and core.penalises_span:
            core.set_aux_loss_coef(self.cfg.held_aux_loss_coef)
        # ... and agent.held_attended_span_coef the attended pull's weight, so that the cue's
        # span, which the stronger penalty presses down, is pulled up as hard
        if self.cfg.held_attended_span_coef is not None and self.anchored and core.pulls_attended:
            core.set_attended_span_coef(self.cfg.held_attended_span_coef)
        # agent.entropy_schedule=rate: the entropy cost keeps an early policy from going
        # deterministic before it reads the cue, and lets a solved one decide as the rate anneals
        self.entropy_coef = self.cfg.entropy_coef * coef_fraction(
            self.cfg.entropy_schedule, fraction
        )

    def whole_unroll(self, unroll: Unroll) -> Minibatch:
        """What the minibatches select from, made once an update: the unroll's acting, its
        targets and, with an active anchor, the anchor's policy over it (from the anchor's
        own memory, which one pass carries on to the next unroll)."""
        advantages, returns = self.targets(unroll)
        mask = unroll.mask
        previous = unroll.previous()
        anchor = None
        if self.anchored:
            anchor = self.anchor.policy(unroll.obs, unroll.starts, previous)
        return Minibatch(
            obs=unroll.obs,
            starts=unroll.starts,
            previous=previous,
            actions=unroll.actions,
            log_probs=unroll.log_probs,
            advantages=advantages,
            returns=returns,
            mask=mask,
            anchor=anchor,
            # agent.cut_uniform_coef: once the task is solved (an anchor holds), a policy that
            # loops until the step limit is pulled towards uniform on the loop's steps
            cut=unroll.cut_episodes if self.cfg.cut_uniform_coef and self.anchored else None,
            start=unroll.start_state,
        )

    def epoch(self, whole: Minibatch) -> Iterator[Minibatch]:
        """An epoch's minibatches of ``whole``: random disjoint sets of whole environment
        sequences (`minibatches`), each from its memory (`start_states`)."""
        starts = whole.starts
        indices = minibatches(starts.shape[0], self.cfg.minibatches, starts.device)
        for index, start in zip(indices, self.start_states(whole.start, indices), strict=True):
            yield whole.select(index, start)

    def forward(self, batch: Minibatch) -> tuple[PolicyParams, torch.Tensor, CoreOutput]:
        """The agent's block mode over the minibatch, through what the gradients flow through
        (`model`), with no memory kept after it."""
        return self.model(batch.obs, batch.start, batch.starts, batch.previous, next_state=False)

    def gradient_step(
        self, batch: Minibatch, policy: PolicyParams, values: torch.Tensor, out: CoreOutput
    ) -> tuple[LossTerms, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """One optimiser step on the minibatch's loss, from the agent's ``policy``,
        ``values`` and core output ``out`` over it; returns its terms: the learner's loss, the
        memory kind's auxiliary loss, the KL to the anchor (None without one) and the KL from
        uniform on the steps of cut episodes (None when they are not pulled)."""
        cfg = self.cfg
        terms = learner_loss(
            cfg,
            policy,
            values,
            batch.actions,
            batch.log_probs,
            batch.advantages,
            batch.returns,
            batch.mask,
        )
        loss = terms.total(cfg.value_coef, self.entropy_coef) + out.aux_loss
        anchor_kl = None
        if batch.anchor is not None:
            anchor_kl = masked_mean(policy_kl(policy, batch.anchor), batch.mask)
            loss = loss + self.anchor_coef * anchor_kl
        cut_kl = None
        if batch.cut is not None:  # agent.cut_uniform_coef, on the greedy envs' steps too
            cut_kl = masked_mean(kl_from_uniform(policy), batch.cut)
            loss = loss + cfg.cut_uniform_coef * cut_kl
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.max_grad_norm:
            clip_gradients(self.parameters, cfg.max_grad_norm)
        self.optimizer.step()
        return terms, out.aux_loss, anchor_kl, cut_kl

    def kl_stops(self, epoch_kl: torch.Tensor | float) -> bool:
        """PPO: whether the unroll's epochs stop after this one, whose mean KL is
        ``epoch_kl``: once the policy is agent.target_kl away from the one that acted (on the
        mean over ranks, so that all ranks stop together)."""
        target_kl = self.cfg.get("target_kl")
        if not target_kl:
            return False
        return all_reduce_mean({"kl": float(epoch_kl)}, self.dist)["kl"] > target_kl

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's entries of the learner: the agent, the optimiser, the anchor (its
        weights, whether the latest interval held, the intervals in a row that did, the best
        interval's agent)."""
        state = {"agent": self.agent.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.anchor is not None:  # (the best solved interval may precede the first anchor)
            state["anchor_streak"] = self.anchor.streak
            state["anchor_best"] = self.anchor.best
        if self.anchored:
            state["anchor"] = self.anchor.state_dict()
            state["anchor_held"] = self.anchor.held
        return state

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        self.agent.load_state_dict(checkpoint["agent"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.anchor is not None:
            self.anchor.streak = checkpoint.get("anchor_streak", 0)
            self.anchor.best = checkpoint.get("anchor_best")
        if self.anchor is not None and "anchor" in checkpoint:
            self.anchor.load_state_dict(checkpoint["anchor"])
            self.anchor.held = checkpoint.get("anchor_held", True)
