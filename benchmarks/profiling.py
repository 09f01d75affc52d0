"""What a profiled region of a benchmark calls: operations, host reads of device values, and
on a GPU kernel launches, kernels and their device time (`update_profile.py` for an RL
update, `memory_efficiency.py --profile` for a language model's training step)."""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
HOST_READ = "aten::_local_scalar_dense"  # a tensor's value read by the host (a GPU waits)
FUSED_STEP = "aten::_fused_"  # a fused optimiser's step, which reads its step counters


def synchronize(device: torch.device) -> None:
    """Waits for the GPU's queued work, so that a timer reads the work's own time."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_parts(events, device: torch.device, parts: Sequence[str]) -> dict[str, dict]:
    """Per part (a `record_function` region named in ``parts``): the operations Python called,
    the host reads of a tensor's value (each a wait for a GPU; those of a fused optimiser's
    step, its step counters on a CPU, apart), the operations of the most host time; on a GPU
    also the kernels launched and their device time, the host-device copies and the waits for
    the GPU."""
    summary = {}
    host_events = [e for e in events if e.device_type == DeviceType.CPU]
    for part in parts:
        # by time, on any thread (on CUDA the backward pass runs on a thread of its own)
        ranges = [e.time_range for e in host_events if e.name == part]
        inside = [
            e for e in host_events if any(r.start <= e.time_range.start <= r.end for r in ranges)
        ]
        ops = [e for e in inside if e.name.startswith("aten::") and not_nested_op(e)]
        host, calls = Counter(), Counter()
        for event in ops:
            host[event.name] += event.cpu_time_total
            calls[event.name] += 1
        reads = [e for e in inside if e.name == HOST_READ]
        in_step = sum(inside_fused_step(e) for e in reads)
        summary[part] = {
            "ops": len(ops),
            "host_reads": len(reads) - in_step,
            "optimizer_step_reads": in_step,
            "top_host_ops": [
                {"op": name, "host_ms": round(us / 1000, 2), "calls": calls[name]}
                for name, us in host.most_common(8)
            ],
        }
        if device.type == "cuda":  # (each kernel is listed under the operation launching it)
            kernels = [k for e in inside for k in e.kernels]
            computing = [k for k in kernels if not k.name.startswith("Memcpy")]
            summary[part].update(
                launches=sum("LaunchKernel" in e.name for e in inside),
                kernels=len(computing),
                kernel_ms=round(sum(k.duration for k in computing) / 1000, 2),
                copies=len(kernels) - len(computing),
                syncs=sum(e.name in SYNC_CALLS for e in inside),
            )
    return summary


def not_nested_op(event) -> bool:
    """An ATen operation called by Python or by autograd, not by another ATen operation."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return False
        parent = parent.cpu_parent
    return True


def inside_fused_step(event) -> bool:
    """Whether ``event`` ran inside a fused optimiser's step."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(FUSED_STEP):
        parent = parent.cpu_parent
    return parent is not None


class ListReads(TorchFunctionMode):
    """Counts the tensors read whole by the host (`Tensor.tolist`), reads that a CPU's profile
    lists as no operation (on a GPU: a copy to the host, which waits for it)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", None) == "tolist"
        return func(*args, **(kwargs or {}))


def sync_sites(run: Callable[[], None]) -> dict[str, int]:
    """Where the project's code (outside benchmarks/) made an operation wait for the GPU in
    ``run()``: the innermost such frame, with how often (CUDA's sync debug mode)."""
    sites = Counter()
    benchmarks = str(ROOT / "benchmarks")

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(str(ROOT))]
        frames = [f for f in frames if not f.filename.startswith(benchmarks)]
        where = frames[-1] if frames else None
        site = f"{Path(where.filename).relative_to(ROOT)}:{where.lineno}" if where else "?"
        sites[site] += 1

    previous_mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():  # (restores showwarning after)
            warnings.simplefilter("always")
            warnings.showwarning = record
            run()
    finally:
        torch.cuda.set_sync_debug_mode(previous_mode)
    return dict(sites.most_common())
