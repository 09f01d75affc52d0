"""The KL anchor: a frozen copy of the agent at its best solved interval (`PolicyAnchor`)."""

from __future__ import annotations

import copy
from typing import Any

import torch

from agents.core import State
from agents.distributions import PolicyParams


class PolicyAnchor:
    """The agent of the best logged interval, once that interval solved the task (its task
    metric, `envs.registry.task_metric`, at least ``solved``), whose policy a KL penalty holds
    the agent near (``agent.anchor_coef``). PPO's clip bounds a policy's move only where an
    advantage pushes it; once a task is solved the advantages are about 0, and the critic's
    regression reshapes the shared core under a policy that nothing holds in place. Before the
    task is solved there is no anchor: one at an unsolved policy would hold back learning (a KL
    to a near-uniform policy is an entropy bonus).

    The anchor reads its own memory (``state``): it starts as the agent's carried memory with
    keys, values and spans recomputed by the anchor's weights, and from then on holds what the
    anchor's own passes over the unrolls write, so within one span every memory it reads is
    the anchor's. Its weights are the learner's checkpoint entry (`state_dict`); its memory,
    like the agent's, is each rank's own (`memory_state_dict`)."""

    def __init__(self, agent: torch.nn.Module, solved: float) -> None:
        self.model = copy.deepcopy(agent).eval().requires_grad_(False)
        self.solved = solved
        self.active = False
        self.state: State | None = None  # the anchor's memory at the next unroll's start

    def keep(self, agent: torch.nn.Module, level: float, state: State) -> None:
        """At a new best interval, whose task metric is ``level``; ``state``: the agent's
        memory at the start of the next unroll."""
        if level >= self.solved:
            self.model.load_state_dict(agent.state_dict())
            self.state = self.model.core.refresh(state)
            self.active = True

    def start(self, state: State) -> None:
        """Before a run's first unroll: unless a checkpoint gave the anchor its memory (a run
        resumed from environments that saved no state gets none), the agent's memory
        ``state`` as the anchor's weights read it."""
        if self.state is None:
            self.state = self.model.core.refresh(state)

    @torch.no_grad()
    def policy(self, obs, episode_start: torch.Tensor, previous) -> PolicyParams:
        """The anchor's policy over an unroll (block mode, from its own memory, which it
        carries on to the next unroll)."""
        policy, _, out = self.model(obs, self.state, episode_start, previous)
        self.state = out.state
        return policy

    def state_dict(self) -> dict[str, Any]:
        """The anchor's weights."""
        return self.model.state_dict()

    def load_state_dict(self, weights: dict[str, Any]) -> None:
        """The weights `state_dict` saved: a checkpoint holds them only once there is an
        anchor."""
        self.model.load_state_dict(weights)
        self.active = True

    def memory_state_dict(self) -> dict:
        """The anchor's memory for a checkpoint (its core's ``save_state``)."""
        return self.model.core.save_state(self.state)

    def load_memory(self, saved: dict, device: torch.device | str) -> None:
        """The memory `memory_state_dict` saved, on ``device``."""
        self.state = self.model.core.load_state(saved, device)
