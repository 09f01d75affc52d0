"""The KL anchor: a frozen copy of the agent that played its best solved interval
(`PolicyAnchor`)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from agents.core import State
from agents.distributions import PolicyParams

log = logging.getLogger(__name__)


def weights_copy(agent: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The agent's weights (its ``state_dict``) as they are now, unchanged by later updates."""
    return {name: value.detach().clone() for name, value in agent.state_dict().items()}


class PolicyAnchor:
    """The agent that played the best logged interval, once that interval solved the task (its
    task metric, `envs.registry.task_metric`, at least ``solved``), whose policy a KL penalty
    holds the agent near (``agent.anchor_coef``). The agent that played an interval is its
    weights at the interval's start: an interval's success measures the policies that acted in
    it, and its last update may already have lost a case (tuning seed 8 of the full Corridor:
    an interval at 0.972 whose end weights succeed 0.79, one case of four at 0). PPO's clip
    bounds a policy's move only where an advantage pushes it; once a task is solved the
    advantages are about 0, and the critic's regression reshapes the shared core under a
    policy that nothing holds in place. Before the task is solved there is no anchor: one at an
    unsolved policy would hold back learning (a KL to a near-uniform policy is an entropy
    bonus).

    Once ``agent.anchor_until`` has let the pull go, the anchor still follows the intervals
    that hold, and one that falls below ``solved`` brings the pull back (`see`), towards the
    best interval's agent: with its cost gone to 0, a nearly deterministic policy that loses a
    case explores nothing that would find it again (a tuning run of the full Corridor: from
    0.997 to 0.50 in one interval after the pull had gone, 0.69 at the end).

    The anchor reads its own memory (``state``): it starts as the agent's carried memory with
    keys, values and spans recomputed by the anchor's weights, and from then on holds what the
    anchor's own passes over the unrolls write, so within one span every memory it reads is
    the anchor's. Its weights and the best interval's agent are the learner's checkpoint
    entries (`state_dict`, ``best``); its memory, like the agent's, is each rank's own
    (`memory_state_dict`)."""

    def __init__(
        self, agent: torch.nn.Module, solved: float, follows: bool = False, after: int = 1
    ) -> None:
        self.model = copy.deepcopy(agent).eval().requires_grad_(False)
        self.solved = solved
        self.follows = follows  # agent.anchor_follows: the agent of every interval that holds
        self.after = after  # agent.anchor_after: intervals in a row at ``solved`` before the first
        self.active = False
        self.held = True  # whether the latest logged interval reached ``solved`` (`see`)
        self.streak = 0  # how many logged intervals in a row, up to the latest, reached ``solved``
        self.best: dict[str, torch.Tensor] | None = None  # the best solved interval's agent
        self.state: State | None = None  # the anchor's memory at the next unroll's start

    def see(
        self,
        level: float,
        played: dict[str, torch.Tensor],
        state: State,
        new_best: bool,
    ) -> None:
        """After every logged interval: its task metric ``level``, the weights ``played`` of
        the agent that played it (`weights_copy` at the interval's start), whether it is the best
        interval so far, and ``state``, the agent's memory at the next unroll's start. The anchor
        becomes the agent of a best interval that reached ``solved`` (with ``follows``, of every
        interval that did); an interval below ``solved`` sends it back to the best interval's
        agent, since the one it followed may already have lost a case (a reporting run of the
        full Corridor: an interval at 0.945 whose first agent fails one case of four, held there
        by the pull for 2M steps while best.pt's agent solves all four). A pull that
        agent.anchor_until let go comes back while an interval is below ``solved``
        (`Learner.set_rate`).

        The first anchor waits for ``after`` intervals in a row at ``solved``: a policy whose
        first interval crosses that level may still hedge on a case, and an anchor there holds it
        undecided (tuning seeds 2 and 5 of the full Corridor, pinned at 0.72-0.87 by an anchor
        taken at one or two intervals at 0.92-0.93 with a policy entropy of 0.42-0.48)."""
        self.held = level >= self.solved
        self.streak = self.streak + 1 if self.held else 0
        if self.held and new_best:
            self.best = played
        if not self.active and self.streak < self.after:
            return
        if self.held and (new_best or self.follows):
            self.hold(played, state)
        elif self.held and not self.active:  # the streak is long enough: the best interval's agent
            self.hold(self.best, state)
        elif not self.held and self.best is not None and not self.holds(self.best):
            log.info("an interval at %.3f: the anchor is back at the best interval's agent", level)
            self.hold(self.best, state)

    def hold(self, weights: dict[str, torch.Tensor], state: State) -> None:
        """The anchor as the agent of ``weights``, reading ``state`` (the agent's memory) with
        keys, values and spans recomputed by those weights."""
        self.model.load_state_dict(weights)
        self.state = self.model.core.refresh(state)
        self.active = True

    def holds(self, weights: dict[str, torch.Tensor]) -> bool:
        """Whether the anchor is the agent of ``weights``."""
        now = self.model.state_dict()
        return all(torch.equal(now[name], value) for name, value in weights.items())

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
