"""torchrun / DistributedDataParallel set-up, device choice and metric reduction.

Under `torchrun --nproc_per_node=N script.py`, every process reads RANK, WORLD_SIZE and
LOCAL_RANK from its environment and joins one process group (gloo on CPU, NCCL on CUDA).
Run plainly, the same script is a single process and no process group is created, so
`DistInfo.is_distributed` tells a trainer whether to wrap its model in DDP.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as torch_dist

from training.config import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job and which device it computes on."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        """Rank 0 logs, writes checkpoints and shows the progress bar."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when a process group with more than one process is up."""
        return self.world_size > 1


def resolve_device(spec: str) -> torch.device:
    """Turn the config's `device` ("auto", "cpu", "cuda" or "cuda:N") into a torch.device."""
    spec = str(spec).strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", spec)
    if match is None:
        raise ConfigError(
            f"device={spec} is not a known device; choose one of: {', '.join(DEVICE_CHOICES)}"
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            f"device={spec} but this PyTorch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}); "
            "use device=cpu or device=auto"
        )
    if match.group(1) is None:
        return torch.device("cuda")
    index, count = int(match.group(1)), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"device={spec} but only {count} CUDA device(s) are visible")
    return torch.device("cuda", index)


def setup_distributed(device: str = "auto") -> DistInfo:
    """Join the torchrun process group if there is one; otherwise describe a single process.

    Each process gets its own GPU (cuda:LOCAL_RANK) when the device is CUDA.
    """
    resolved = resolve_device(device)
    if "WORLD_SIZE" not in os.environ:
        return DistInfo(device=resolved)
    try:
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    except (KeyError, ValueError) as error:
        raise ConfigError(
            "WORLD_SIZE is set but RANK/LOCAL_RANK are missing or not integers; "
            "start the script with torchrun, or unset WORLD_SIZE for a single process"
        ) from error
    if resolved.type == "cuda":
        if world_size > 1 and resolved.index is not None:
            raise ConfigError(
                f"device={device} under torchrun: each process uses cuda:LOCAL_RANK; "
                "use device=cuda (or auto) and choose GPUs with CUDA_VISIBLE_DEVICES"
            )
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"torchrun started local rank {local_rank} but only "
                f"{torch.cuda.device_count()} CUDA device(s) are visible: start at most that "
                "many processes per node (--nproc_per_node), or train on the CPU (device=cpu)"
            )
        resolved = torch.device("cuda", local_rank)
        torch.cuda.set_device(resolved)
    info = DistInfo(rank=rank, world_size=world_size, local_rank=local_rank, device=resolved)
    if info.is_distributed and not torch_dist.is_initialized():
        backend = "nccl" if resolved.type == "cuda" else "gloo"
        torch_dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return info


def cleanup_distributed(exc_type: type | None = None, *_: Any) -> None:
    """Leave the process group (safe to call when there is none); an ExitStack exit callback.

    After a finished run the ranks leave together (a barrier): rank 0 evaluates while the
    others are done, and under torch 2.4 a gloo group freed after a peer has gone waits
    forever. After an exception nobody waits, since the other ranks may be gone.
    A DistributedDataParallel wrapper sits in a reference cycle that keeps the group's
    backend alive after this call; the trainers collect it once `train` has returned, because
    a gloo group freed during interpreter shutdown can abort the process after a finished run.
    """
    if torch_dist.is_initialized():
        if exc_type is None:
            torch_dist.barrier()
        torch_dist.destroy_process_group()


def all_reduce_mean(metrics: Mapping[str, Any], dist: DistInfo) -> dict[str, float]:
    """Average scalar metrics over ranks; NaN marks "no value on this rank" and is skipped.

    A rank that finished no episode in the interval passes NaN for `return`, and the mean
    is taken over the ranks that have one (NaN if none has). Every rank must pass the same
    keys.
    """
    keys = sorted(metrics)
    values = [float(metrics[key]) for key in keys]
    if not dist.is_distributed:
        return dict(zip(keys, values, strict=True))
    stacked = torch.tensor(values, dtype=torch.float64, device=dist.device)
    present = ~torch.isnan(stacked)
    totals = torch.stack([torch.where(present, stacked, 0.0), present.to(torch.float64)])
    torch_dist.all_reduce(totals)
    sums, counts = totals.tolist()
    return {
        key: total / count if count else math.nan
        for key, total, count in zip(keys, sums, counts, strict=True)
    }


def all_reduce_max(value: float, dist: DistInfo) -> float:
    """The largest of one scalar over ranks."""
    if not dist.is_distributed:
        return value
    largest = torch.tensor([value], dtype=torch.float64, device=dist.device)
    torch_dist.all_reduce(largest, op=torch_dist.ReduceOp.MAX)
    return float(largest)


def all_gather_object(obj: Any, dist: DistInfo) -> list[Any]:
    """Collect one picklable object from every rank, in rank order (e.g. per-rank RNG states)."""
    if not dist.is_distributed:
        return [obj]
    gathered: list[Any] = [None] * dist.world_size
    torch_dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any, dist: DistInfo) -> Any:
    """Return rank 0's `obj` on every rank."""
    if not dist.is_distributed:
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_parameter_digests(model: torch.nn.Module, dist: DistInfo) -> list[str]:
    """Every rank's hash of its parameters (a collective); raises if the ranks differ, which
    DDP's all-reduced updates must never let happen."""
    flat = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    digests = all_gather_object(hashlib.sha1(flat.numpy().tobytes()).hexdigest(), dist)
    if len(set(digests)) > 1:
        raise RuntimeError(f"DDP ranks hold different parameters: {digests}")
    return digests
