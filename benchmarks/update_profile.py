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
- per part, from the profiled update: ``ops`` (ATen operations Python called),
  ``host_reads`` (tensor values read by the host, on a GPU each a wait for it, including the
  tensors read whole, `tolist`), ``optimizer_step_reads`` (those of the fused optimiser's
  step: its step counters, on a CPU) and ``top_host_ops`` (those of the most host time,
  with their calls); on a GPU also
  ``launches`` (kernel launch calls), ``kernels`` and ``kernel_ms`` (the kernels run and
  their summed device time), ``copies`` (memory copies) and ``syncs`` (waits for the GPU);
- ``sync_sites``: where in the project's code an operation waited for the GPU, with counts
  (CUDA only): the synchronisations inside an unroll or an update.

With the override ``compile_learner=MODE`` the learner runs compiled as in training (its
compilations fall in the warm-up updates, one for each length its padded memories take), and
a region the compiler fails on runs eagerly, its error logged.
"""

from __future__ import annotations

from training.openmp import shorten_openmp_spinning

shorten_openmp_spinning()  # first: OpenMP reads its spin count once, when torch loads it

# ruff: noqa: E402  (the imports below follow that call on purpose)

import json
import time
from contextlib import nullcontext

import torch
from profiling import ListReads, profile_parts, sync_sites, synchronize
from torch.profiler import ProfilerActivity, profile, record_function
from unroll_time import build_parts, run_arg_parser

from agents.rollout import collect_unroll
from training.metrics import SpanStats

PARTS = ("acting", "learner")


def main() -> None:
    parser = run_arg_parser(__doc__.splitlines()[0], updates=5, warmup=3, example="device=cuda")
    args = parser.parse_args()
    total = args.warmup + args.updates + 2  # (the profiled update and the debugged one)
    torch._dynamo.config.suppress_errors = True  # (compile_learner: a failed region runs eagerly)
    run = build_parts(args.overrides, args.threads, total)
    agent, learner, player, unroll = run.agent, run.learner, run.player, run.unroll
    cfg, device, bootstrap_truncated = run.cfg, run.player.device, run.bootstrap_truncated
    index = 0

    def run_update(seconds: dict[str, float] | None = None, lists: dict | None = None) -> None:
        """One update; ``seconds``: each part's time added, ``lists``: each part's tensors
        read whole (`ListReads`) set."""
        nonlocal index
        counting = lists is not None
        reads = {part: ListReads() if counting else nullcontext() for part in PARTS}
        start = time.perf_counter()
        with record_function("acting"), reads["acting"]:
            collect_unroll(agent, player, unroll, SpanStats(), bootstrap_truncated)
            synchronize(device)
        middle = time.perf_counter()
        with record_function("learner"), reads["learner"]:
            learner.update(unroll, index)
            synchronize(device)
        if counting:
            lists.update({part: counter.count for part, counter in reads.items()})
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
    lists = {}
    with profile(activities=activities) as profiled:
        run_update(lists=lists)
    parts = profile_parts(profiled.events(), device, PARTS)
    for part, count in lists.items():
        parts[part]["host_reads"] += count
    result = {
        "overrides": args.overrides,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "num_envs": cfg.num_envs,
        "compile_learner": cfg.compile_learner,
        "steps_per_s": round(args.updates * cfg.num_envs * cfg.unroll_len / sum(seconds.values())),
        "ms_per_update": {part: round(s / args.updates * 1000, 1) for part, s in seconds.items()},
        "memory_size": round(unroll.memory_size, 1),
        **parts,
    }
    if device.type == "cuda":
        result["sync_sites"] = sync_sites(run_update)
    player.vec_env.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
