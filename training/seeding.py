"""Seeds and RNG states, so runs repeat and a resumed run continues the same random streams.

States are stored as tensors and plain Python values, which `torch.load(weights_only=True)`
accepts.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

# Rank r seeds with seed + r * RANK_SEED_STRIDE: rank 0 keeps the config's seed (a one-process
# run and rank 0 of a torchrun job match), and per-environment seeds seed + i of different
# ranks never overlap while a rank has fewer environments than the stride.
RANK_SEED_STRIDE = 1_000_000


def rank_seed(seed: int, rank: int) -> int:
    """The seed of process `rank` in a job started with `seed`."""
    return seed + rank * RANK_SEED_STRIDE


# Evaluation seeds its environments with seed + EVAL_SEED_OFFSET (+ i for env i): past every
# training seed of a job of fewer than 1000 ranks, so evaluation plays layouts training never
# started from.
EVAL_SEED_OFFSET = 1000 * RANK_SEED_STRIDE


def eval_seed(seed: int) -> int:
    """The seed evaluation starts its environments from, in a run started with `seed`."""
    return seed + EVAL_SEED_OFFSET


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
