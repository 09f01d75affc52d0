"""What a run does when its training diverges: a loss, a gradient or a parameter that is not
finite (`DivergenceGuard`, for both trainers).

By default (`nonfinite: stop`) the run stops at the update where it first appears, before
that update's checkpoint, with one line that names the update, the step and the quantity, so
every file the run wrote keeps finite weights. `nonfinite: skip` undoes such an update instead
(the parameters and the optimiser's state as they were before it) and counts it; after
`nonfinite_skips` skipped updates in a row the next one stops the run.

An update is judged once: the gradients of each optimiser step (a hook on the optimiser) and
the parameters after its last step are noted on the device, the losses the trainer has read
already are added, and one reduction over the ranks and one host read decide, so that every
rank agrees and a GPU step waits on nothing per minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as torch_dist

from training.config import RunError, check_choice, check_positive_int
from training.distributed import DistInfo
from training.run_dir import CHECKPOINT_FILE

NONFINITE = ("stop", "skip")
DIVERGENCE_EXIT_CODE = 3
QUANTITIES = ("loss", "gradient", "parameters")  # in the order one makes the next non-finite
LOSS, GRADIENT, PARAMETERS = range(len(QUANTITIES))
FINITE = 2**62  # a quantity's code while it is finite (else: the first optimiser step, or 0)


class DivergenceError(RunError):
    """Training produced a value that is not finite; the message says where and what next."""

    kind = "Divergence"
    exit_code = DIVERGENCE_EXIT_CODE


def check_nonfinite_config(cfg: Any) -> None:
    """The `nonfinite` and `nonfinite_skips` settings, which both trainers share."""
    check_choice("nonfinite", cfg.nonfinite, NONFINITE)
    check_positive_int("nonfinite_skips", cfg.nonfinite_skips)


def resume_remedy(
    script: str, run_dir: Path, cfg: Any, checkpoint: Mapping | None, rates: str
) -> str:
    """What the line of a stopped run says to do next: resume ``script`` from the last
    checkpoint with lower ``rates`` (e.g. "lr=..."), giving this run's total_steps where a
    resume set it (the checkpoint would continue to its own)."""
    budget = ""
    if checkpoint is not None and checkpoint["config"]["total_steps"] != cfg.total_steps:
        budget = f" total_steps={cfg.total_steps}"
    command = f"python {script} hydra.run.dir={run_dir} resume=true{budget} {rates}"
    return f"resume from the last checkpoint with a lower rate or a tighter clip: {command}"


def all_finite(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Whether every element of ``tensors`` is finite, as a tensor on their device (no host
    read): their largest magnitudes, which cannot overflow as a sum of squares can."""
    return torch.stack(torch._foreach_norm(tensors, math.inf)).isfinite().all()


class DivergenceGuard:
    """Judges each update of ``model`` by ``optimizer`` as the run's `nonfinite` and
    `nonfinite_skips` say (``cfg``): call `begin` before the update's first optimiser step and
    `end` after its last. The line that stops the run ends with ``remedy``, what to do next
    when ``run_dir`` holds a checkpoint."""

    def __init__(
        self,
        cfg: Any,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dist: DistInfo,
        run_dir: Path,
        remedy: str,
    ) -> None:
        self.mode, self.max_skips, self.dist = cfg.nonfinite, cfg.nonfinite_skips, dist
        self.parameters = list(model.parameters())
        self.optimizer, self.run_dir, self.remedy = optimizer, run_dir, remedy
        self.skipped_in_a_row = 0
        self._codes: torch.Tensor | None = None  # per quantity: FINITE, or where it was not
        self._steps = 0  # the update's optimiser steps so far
        self._saved: tuple[list[torch.Tensor], dict] | None = None
        optimizer.register_step_pre_hook(self._note_gradients)

    def begin(self) -> None:
        """Starts an update; with `skip`, keeps what undoing it restores (the one cost of
        skipping: a copy of the parameters and the optimiser's state per update)."""
        device = self.parameters[0].device
        self._codes = torch.full((len(QUANTITIES),), FINITE, dtype=torch.int64, device=device)
        self._steps = 0
        if self.mode == "skip":
            self._saved = self._snapshot()

    def end(self, losses: Mapping[str, float], update: int, step: int) -> bool:
        """Whether the update just taken (``update`` counted from 1, ending at ``step``) was
        skipped, ``losses`` being the values of it the trainer has read; raises
        DivergenceError to stop the run (a collective: every rank calls it)."""
        self._note(PARAMETERS, self.parameters, 0)
        bad_losses = [key for key, value in losses.items() if not math.isfinite(value)]
        if bad_losses:
            self._codes[LOSS] = 0
        if self.dist.is_distributed:
            torch_dist.all_reduce(self._codes, op=torch_dist.ReduceOp.MIN)
        codes = self._codes.tolist()  # the update's one host read
        if min(codes) == FINITE:
            self.skipped_in_a_row = 0
            return False
        where = f"update {update} (step {step}) is not finite in {describe(codes, bad_losses)}"
        if self._saved is not None:
            self._restore()
        if self.mode == "skip" and self.skipped_in_a_row < self.max_skips:
            self.skipped_in_a_row += 1
            return True
        if self.mode == "skip":
            where += f", nonfinite_skips={self.max_skips} updates in a row skipped before it"
        raise DivergenceError(f"{where}; {self._next_step()}")

    def _next_step(self) -> str:
        checkpoint = self.run_dir / CHECKPOINT_FILE
        if not checkpoint.exists():
            return (
                "no checkpoint was saved before it: start the run again with a lower rate "
                f"(overwrite=true replaces it in {self.run_dir})"
            )
        return f"nothing of it was saved ({checkpoint} holds the last finite state); {self.remedy}"

    def _note_gradients(self, optimizer: torch.optim.Optimizer, *_: Any) -> None:
        """The optimiser's step pre-hook: notes whether this step's gradients are finite."""
        if self._codes is None:  # (a step outside an update)
            return
        self._steps += 1
        gradients = [p.grad for p in self.parameters if p.grad is not None]
        if gradients:
            self._note(GRADIENT, gradients, self._steps)

    def _note(self, quantity: int, tensors: list[torch.Tensor], code: int) -> None:
        """Keeps ``code`` for ``quantity`` unless an earlier one is kept, where ``tensors``
        are not all finite; on the device."""
        kept = self._codes[quantity]
        self._codes[quantity] = torch.where(all_finite(tensors), kept, kept.clamp(max=code))

    def _snapshot(self) -> tuple[list[torch.Tensor], dict]:
        with torch.no_grad():
            parameters = [p.detach().clone() for p in self.parameters]
        state = {
            p: {key: v.clone() if torch.is_tensor(v) else v for key, v in values.items()}
            for p, values in self.optimizer.state.items()
        }
        return parameters, state

    def _restore(self) -> None:
        parameters, state = self._saved
        with torch.no_grad():
            for parameter, saved in zip(self.parameters, parameters, strict=True):
                parameter.copy_(saved)
        self.optimizer.state.clear()  # (moments the update created, at the run's first, go)
        self.optimizer.state.update(state)
        self._saved = None


def describe(codes: list[int], bad_losses: list[str]) -> str:
    """The quantities of an update that were not finite, in words."""
    found = []
    if codes[LOSS] != FINITE:
        found.append("the loss" + (f" ({', '.join(bad_losses)})" if bad_losses else ""))
    if codes[GRADIENT] != FINITE:
        found.append(f"the gradient (from its optimiser step {codes[GRADIENT]})")
    if codes[PARAMETERS] != FINITE:
        found.append("the parameters")
    return found[0] if len(found) == 1 else f"{', '.join(found[:-1])} and {found[-1]}"
