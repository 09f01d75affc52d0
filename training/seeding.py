"""Seeds and RNG states, so runs repeat and a resumed run continues the same random streams.

States are stored as tensors and plain Python values, which `torch.load(weights_only=True)`
accepts.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

# Rank r seeds its global generators (PyTorch's sampling, NumPy's, Python's) with
# seed + r * RANK_SEED_STRIDE: rank 0 keeps the config's seed, so a one-process run and rank 0
# of a torchrun job match. Environments are seeded apart, by `env_seeds`.
RANK_SEED_STRIDE = 1_000_000


def rank_seed(seed: int, rank: int) -> int:
    """The seed of process `rank`'s global generators in a job started with `seed`."""
    return seed + rank * RANK_SEED_STRIDE


# What a run's environments are for; each purpose draws streams of its own, so evaluation and
# recording play layouts that training never started from.
PURPOSES = ("train", "eval", "record")


def env_seeds(seed: int, rank: int, num_envs: int, purpose: str, step: int = 0) -> list[int]:
    """One 64-bit seed per environment of process `rank`, for `purpose` ("train", "eval" or
    "record"), drawn from NumPy's SeedSequence of (seed, rank, purpose), and of `step` where a
    run resumes at a step its environments cannot continue from (they save no state).

    Every run, rank, purpose and environment gets a stream of its own. Gymnasium's int seed
    (env i seeded with seed + i) would make runs on adjacent seeds share all but one stream;
    64 bits keep the draws of many runs apart (32-bit seeds collide by the birthday bound).
    A resumed run's streams are new ones rather than its first again, so it replays no episode.
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose must be one of {PURPOSES}, got {purpose!r}")
    if min(seed, rank, step) < 0:
        raise ValueError(
            f"seeds, ranks and steps are non-negative integers, got seed={seed} rank={rank} "
            f"step={step}"
        )
    key = (rank, PURPOSES.index(purpose), *((step,) if step else ()))  # (step 0: a new run's)
    sequence = np.random.SeedSequence(seed, spawn_key=key)
    return [int(word) for word in sequence.generate_state(num_envs, np.uint64)]


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and PyTorch's (CPU and CUDA) global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """This process's global RNG states (Python, NumPy, PyTorch CPU and CUDA)."""
    bit_generator, key, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (bit_generator, key.tolist(), pos, has_gauss, cached_gaussian),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_state(state: dict[str, Any]) -> None:
    """Put back the generators saved by `rng_state`."""
    random.setstate(state["python"])
    bit_generator, key, pos, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state(
        (bit_generator, np.array(key, dtype=np.uint32), pos, has_gauss, cached_gaussian)
    )
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
