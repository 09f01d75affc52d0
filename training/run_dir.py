"""The run directory: where a run's config, metrics and checkpoints live.

A run directory holds `config.yaml` (the resolved config), `metrics.jsonl` and
`checkpoint.pt`; sweep tools read the first two. Under Hydra it is the job's output
directory (for `-m` sweeps, SWEEP_DIR/<job number>); otherwise the working directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from training.distributed import DistInfo, broadcast_object
from training.files import atomic_open

CONFIG_FILE = "config.yaml"


def get_run_dir(dist: DistInfo | None = None) -> Path:
    """This run's directory; under torchrun every rank gets rank 0's.

    Each torchrun process starts its own Hydra app, and a timestamped Hydra run directory
    can differ by a second between ranks, so rank 0's choice is broadcast.
    """
    run_dir = HydraConfig.get().runtime.output_dir if HydraConfig.initialized() else os.getcwd()
    if dist is not None:
        run_dir = broadcast_object(str(run_dir), dist)
    return Path(run_dir)


def command_line_overrides() -> list[str]:
    """The `key=value` overrides the run was started with (none outside Hydra)."""
    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def save_resolved_config(run_dir: str | os.PathLike, cfg: Any) -> Path:
    """Write the config with every interpolation resolved to RUN_DIR/config.yaml, atomically."""
    path = Path(run_dir) / CONFIG_FILE
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    with atomic_open(path, "w") as file:
        file.write(OmegaConf.to_yaml(cfg, resolve=True))
    return path
