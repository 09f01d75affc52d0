"""How a training process uses the machine it runs on: CPU threads, freed memory, and what
it says of its device.

Both matter on a CPU because the models here are small: every operation of a gradient step
makes and frees tensors of a megabyte or two, so where that memory comes from costs as much
as a fair part of the arithmetic, and the matrix products split well over a few cores
(docs/performance.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from training.config import ConfigError

AUTO = "auto"
# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD_MAX = 32 * 2**20  # the largest value glibc accepts on 64-bit hosts
_TRIM_THRESHOLD = 2**30
# Acting in step mode: a second thread pays from about this many values per operation (one
# step's batch x width); below, waking it costs more than it saves (docs/performance.md).
VALUES_PER_ACTING_THREAD = 8192
# An RL run on a GPU with fewer environments than this leaves it mostly idle: on one H200 the
# PPO default ran 3.9k steps/s with its 32 environments and about 115k with 1024 (9a8edc0).
# Even 1024 kept that GPU busy only 10-30% of the time, bound by the host's operations
# (docs/performance.md, "On a GPU"), so the hint names a floor, not a full GPU.
GPU_FILLING_ENVS = 1024


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, e.g. a container's share)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_count(setting: int | str, local_processes: int = 1) -> int:
    """Intra-op threads for ``torch_threads``: a positive number, or ``auto``: OMP_NUM_THREADS
    when set (torchrun sets it for several processes per node, joblib's workers to their share
    of the cores), else the available cores shared equally among the ``local_processes`` of
    a job on this machine, at least one each."""
    if setting == AUTO:
        limit = os.environ.get("OMP_NUM_THREADS", "")
        if limit.isdigit() and int(limit) > 0:
            return int(limit)
        return max(1, available_cores() // local_processes)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ConfigError(
            f"torch_threads={setting}: give a positive number of threads, or torch_threads=auto "
            "to use every core of the machine"
        )
    return setting


def local_processes() -> int:
    """The processes of this job on this machine (torchrun sets LOCAL_WORLD_SIZE)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def use_host(torch_threads: int | str) -> int:
    """Sets torch's intra-op threads from the ``torch_threads`` setting and keeps freed
    memory in the process (``keep_freed_memory``); returns the number of threads."""
    threads = thread_count(torch_threads, local_processes())
    torch.set_num_threads(threads)
    keep_freed_memory()
    return threads


@contextmanager
def acting_threads(values: int) -> Iterator[int]:
    """Runs the block on as many of torch's threads as operations of ``values`` elements (a
    step's batch x width) keep busy, one per VALUES_PER_ACTING_THREAD, at least one; yields
    that number. Acting's operations are a few rows each: at 64 environments of a 64-wide
    core two threads act 20% slower than one, at 256 they act 25% faster."""
    threads = torch.get_num_threads()
    acting = max(1, min(threads, values // VALUES_PER_ACTING_THREAD))
    torch.set_num_threads(acting)
    try:
        yield acting
    finally:
        torch.set_num_threads(threads)


def _glibc() -> ctypes.CDLL | None:
    """The C library if it is glibc (it has mallopt and malloc_trim), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt, libc.malloc_trim  # noqa: B018  (glibc's own functions)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    """Make glibc reuse freed blocks instead of returning them to the system.

    By default glibc serves blocks above a threshold with fresh mappings and unmaps them when
    freed, so every large tensor of every step faults its pages in again: about a sixth of a
    gradient step of the paper's Corridor agent. Raising the mapping and trimming thresholds
    keeps them in the heap. Returns False where the C library is not glibc (nothing done).
    """
    libc = _glibc()
    return (
        libc is not None
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX))
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    )


def return_freed_memory() -> bool:
    """The opposite, to measure live memory: from now on glibc maps blocks above 128 kB
    afresh and unmaps them when freed, and it returns its free memory now, so the resident
    set size follows the live tensors rather than the allocator's cache. False without glibc."""
    libc = _glibc()
    return (
        libc is not None
        and bool(libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024))
        and libc.malloc_trim(0) >= 0
    )


def describe_device(device: torch.device, environments: int | None = None) -> str:
    """One line: the device a run trains on, and for an RL run on a GPU whose `environments`
    (over all processes) leave it mostly idle, how many fill it."""
    if device.type != "cuda":
        return f"device: the CPU, {torch.get_num_threads()} thread(s)"
    line = f"device: {device} ({torch.cuda.get_device_name(device)})"
    if environments is not None and environments < GPU_FILLING_ENVS:
        line += (
            f"; {environments} environments leave it mostly idle: give num_envs so that "
            f"{GPU_FILLING_ENVS} or more step at once (on an H200 the PPO default ran 3.9k "
            "steps/s with 32, about 115k with 1024, 253k with 4096)"
        )
    return line
