"""The start and the checkpoints of a training run, as both trainers take them (a finished
run's report is `analysis.report`'s)."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from training.composition import describe_start
from training.config import ConfigError
from training.distributed import (
    DistInfo,
    all_gather_object,
    cleanup_distributed,
    gather_parameter_digests,
    setup_distributed,
)
from training.host import describe_device, use_host
from training.run_dir import get_run_dir
from training.seeding import rng_state

log = logging.getLogger(__name__)


@dataclass
class RunProgress:
    """Where a run is: updates and steps done, POPGym's MMER (the best interval mean return
    so far, Gymnasium envs) and the best logged task metric ``best`` ({metric, value, step})."""

    update: int = 0
    step: int = 0
    mmer: float = math.nan
    best: dict | None = None


def start_run(
    resources: ExitStack,
    cfg: DictConfig,
    checkpoint: Mapping | None,
    environments_per_process: int | None = None,
) -> tuple[DistInfo, Path]:
    """The processes (torchrun's, or this one alone), their threads and heap, and the run
    directory; ``resources`` closes the process group on every way out. A resumed run must
    have as many processes as wrote its checkpoint: each continues one rank's environments,
    memory and random streams. A run that Hydra started says first where its settings come
    from (`describe_start`), then every run what it trains on (`describe_device`, which an RL
    run's `environments_per_process` tells whether its environments fill a GPU)."""
    dist = setup_distributed(cfg.device)
    resources.push(cleanup_distributed)
    use_host(cfg.torch_threads)
    run_dir = get_run_dir(dist)
    if checkpoint is not None and len(checkpoint["rng"]) != dist.world_size:
        writers = len(checkpoint["rng"])
        raise ConfigError(
            f"the checkpoint in {run_dir} was written by {writers} process(es), not "
            f"{dist.world_size}; resume it with as many (torchrun --nproc_per_node={writers})"
        )
    if dist.is_main and HydraConfig.initialized():
        log.info(describe_start(cfg, checkpoint, run_dir))
    if dist.is_main:
        per_process = environments_per_process
        environments = None if per_process is None else per_process * dist.world_size
        log.info(describe_device(dist.device, environments))
    return dist, run_dir


def gather_rank_states(dist: DistInfo, model: torch.nn.Module, **carried: Any) -> dict[str, list]:
    """The checkpoint's entries that every rank gives (a collective: every rank calls it):
    "rng", each rank's random streams; one list per keyword of ``carried``, each rank's value
    (what the rank carries from one update to the next); and "parameter_digests", which a
    resumed run checks its ranks' parameters against."""
    gathered = {"rng": all_gather_object(rng_state(), dist)}
    for name, value in carried.items():
        gathered[name] = all_gather_object(value, dist)
    gathered["parameter_digests"] = gather_parameter_digests(model, dist)
    return gathered
