"""The learning-rate schedules of both trainers, as a fraction of the peak rate."""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear")  # the RL learner's choices (agent.lr_schedule)
# agent.anchor_schedule and agent.entropy_schedule: "rate" scales the coefficient with lr_fraction
COEF_SCHEDULES = ("constant", "rate")


def coef_fraction(schedule: str, rate_fraction: float) -> float:
    """The fraction of its value a loss coefficient takes under ``schedule`` (COEF_SCHEDULES)
    when the rate is at ``rate_fraction`` of its peak."""
    return rate_fraction if schedule == "rate" else 1.0


def lr_fraction(schedule: str, step: int, total: int, warmup: int = 0, floor: float = 0.0) -> float:
    """The fraction of the peak rate that step ``step`` (0-based, of ``total``) takes: a linear
    warm-up over the first ``warmup`` steps, then

    - "constant": 1;
    - "linear": from 1 down to 1 / total at the last step, PPO's annealing (Schulman et al.
      2017), so that the updates of a long run shrink to nothing instead of random-walking a
      solved policy;
    - "cosine": a cosine from 1 down to ``floor`` at ``total``, the language models'.
    """
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return 1 - progress
    if schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return 1.0
