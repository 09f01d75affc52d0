"""Where an update's time goes on the run's device (a GPU above all): acting one unroll and
the learner's update, each timed, profiled and searched for host synchronisations.

    python benchmarks/update_profile.py [--updates 5] [--warmup 3] [OVERRIDE ...]
    python benchmarks/update_profile.py device=cuda num_envs=1024 env.max_length=20

Builds the run's envs, agent, learner and player as train_rl.py does (on the config's
``device``), runs ``--warmup`` updates, then times ``--updates`` more, each part ended by a
device synchronisation. Then one more update under torch.profiler (CPU, and CUDA where the
device is a GPU), and one with CUDA's synchronisation debugging on. Prints one JSON object:
- ``steps_per_s`` and ``ms_per_update``: ``acting`` (the unroll: the agent, the envs, the
  buffers) and ``learner``;
- per part, from the profiled update: ``ops`` (ATen operations Python called) and
  ``top_host_ops`` (those of the most host time, with their calls); on a GPU also
  ``launches`` (kernel launch calls), ``kernels`` and ``kernel_ms`` (the kernels run and
  their summed device time), ``copies`` (memory copies) and ``syncs`` (waits for the GPU);
- ``sync_sites``: where in the project's code an operation waited for the GPU, with counts
  (CUDA only): the synchronisations inside an unroll or an update.
"""

from __future__ import annotations

import training  # noqa: F401  (first: it sets OpenMP's spin count, as for train_rl.py)

# isort: split

import json
import time
import traceback
import warnings
from collections import Counter
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function
from unroll_time import build_parts, parse_run_args

from agents.rollout import collect_unroll
from training import SpanStats

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("acting", "learner")
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile_parts(events, device: torch.device) -> dict[str, dict]:
    """Per part (a `record_function` region of PARTS): the operations Python called, the
    kernels launched and their device time, the host-device copies, the waits for the GPU,
    and the operations of the most host time."""
    summary = {}
    host_events = [e for e in events if e.device_type == DeviceType.CPU]
    for part in PARTS:
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
        summary[part] = {
            "ops": len(ops),
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


def sync_sites(run_update) -> dict[str, int]:
    """Where the project's code made an operation wait for the GPU in ``run_update()``: the
    innermost frame in the project's files, with how often."""
    sites = Counter()

    def record(message, category, filename, lineno, file=None, line=None):
        if "synchronizing" not in str(message):
            return
        frames = [f for f in traceback.extract_stack() if f.filename.startswith(str(ROOT))]
        frames = [f for f in frames if not f.filename.endswith("update_profile.py")]
        where = frames[-1] if frames else None
        site = f"{Path(where.filename).relative_to(ROOT)}:{where.lineno}" if where else "?"
        sites[site] += 1

    previous_mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():  # (restores showwarning after)
            warnings.simplefilter("always")
            warnings.showwarning = record
            run_update()
    finally:
        torch.cuda.set_sync_debug_mode(previous_mode)
    return dict(sites.most_common())


def main() -> None:
    args = parse_run_args(__doc__.splitlines()[0], updates=5, warmup=3, example="device=cuda")
    total = args.warmup + args.updates + 2  # (the profiled update and the debugged one)
    run = build_parts(args.overrides, args.threads, total)
    agent, learner, player, unroll = run.agent, run.learner, run.player, run.unroll
    cfg, device, bootstrap_truncated = run.cfg, run.player.device, run.bootstrap_truncated
    index = 0

    def run_update(seconds: dict[str, float] | None = None) -> None:
        nonlocal index
        start = time.perf_counter()
        with record_function("acting"):
            collect_unroll(agent, player, unroll, SpanStats(), bootstrap_truncated)
            synchronize(device)
        middle = time.perf_counter()
        with record_function("learner"):
            learner.update(unroll, index)
            synchronize(device)
        if seconds is not None:
            seconds["acting"] += middle - start
            seconds["learner"] += time.perf_counter() - middle
        index += 1

    for _ in range(args.warmup):
        run_update()
    seconds = dict.fromkeys(PARTS, 0.0)
    for _ in range(args.updates):
        run_update(seconds)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiled:
        run_update()
    result = {
        "overrides": args.overrides,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "num_envs": cfg.num_envs,
        "steps_per_s": round(args.updates * cfg.num_envs * cfg.unroll_len / sum(seconds.values())),
        "ms_per_update": {part: round(s / args.updates * 1000, 1) for part, s in seconds.items()},
        "memory_size": round(unroll.memory_size, 1),
        **profile_parts(profiled.events(), device),
    }
    if device.type == "cuda":
        result["sync_sites"] = sync_sites(run_update)
    player.vec_env.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
