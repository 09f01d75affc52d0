"""Where an update's time goes for a train_rl.py config: the agent acting in step mode, the
environments stepping, the rest of collecting the unroll, and the learner; and how close acting
is to what its arithmetic needs.

    python benchmarks/unroll_time.py [--updates 30] [--threads auto] [OVERRIDE ...]
    python benchmarks/unroll_time.py preset=paper           # the paper's A2C, 64 environments

Builds the run's envs, agent, learner and player as train_rl.py does and times `--updates`
updates after `--warmup` more (memory sizes settle). Prints one JSON object: the steps per
second, the milliseconds per update of each part, and how close acting is to its arithmetic,
all on the threads acting runs on (`acting_threads`):
- `acting_products_ms`: the matrix products of one acting step (recorded with their inputs,
  shapes and strides), replayed back to back, per update: what acting costs if nothing but
  its products took time;
- `acting_floor_ms`: acting's matrix FLOPs per step (torch.utils.flop_counter) at the rate of
  a large float32 product (`matrix_gflops`): the same FLOPs if they ran at that rate;
- with `compile_acting=true`, `acting_compiled_call_ms`: the compiled step's library alone,
  called again and again on one step's inputs, per update: acting without the Python around
  the library (planning the step, its bookkeeping); and `acting_library_in_run_ms`, the same
  library's calls timed where acting made them in the timed updates: acting less this is the
  Python around the library.
Then one more unroll with acting under torch.profiler (`acting_profiled_ms`, per update): the
matrix products in place, the other ATen operations, and the rest, Python and the profiler's
own cost; and `acting_ops_per_step`, the operations Python calls per step.

And one gradient step of the learner as an update takes it (the forward pass over a minibatch,
the loss, the backward pass, clipping and the optimiser's step), on torch's threads, called
again and again on the first minibatch of an epoch over the last unroll: `learner_step_ms`,
the least of five rounds; `learner_products_ms`, its matrix products (recorded in the step,
backward pass included) replayed back to back; `learner_step_over_products`; and under
torch.profiler, `learner_profiled_ms` split as acting's is, for the forward pass (`forward`)
and the rest (`gradient`), and `learner_other_ops`, the operations other than products that
take the most time in the step, by self time.
"""

from __future__ import annotations

from training.openmp import shorten_openmp_spinning

shorten_openmp_spinning()  # first: OpenMP reads its spin count once, when torch loads it

# ruff: noqa: E402  (the imports below follow that call on purpose)

import argparse
import json
import math
import time
from collections import Counter
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from agents.actor_critic import ActorCritic
from agents.build import build_agent
from agents.distributions import sampling_noise
from agents.episodes import EpisodeStats
from agents.play import Player
from agents.rollout import Unroll, collect_unroll
from agents.update import Learner
from envs.registry import make_vector_env, named_env
from training.distributed import DistInfo, resolve_device
from training.host import acting_threads, use_host
from training.metrics import SpanStats
from training.schemas import register_schemas
from training.seeding import env_seeds, seed_everything

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


class Timer:
    """Seconds spent in the calls of the functions it wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


MATRIX_PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm"}


class ProductRecorder(TorchDispatchMode):
    """Records the matrix products called under it, each with a copy of its inputs (same
    shapes and strides), to replay them alone."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func.name().split(".")[0] in MATRIX_PRODUCTS:
            copied = [_copy(a) for a in args]
            self.calls.append((func, copied, {k: _copy(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)

    def replay_seconds(self, repeats: int = 200) -> float:
        """Seconds per replay of every recorded product, the least of five rounds."""

        def replay() -> None:
            for func, args, kwargs in self.calls:
                func(*args, **kwargs)

        return least_seconds(replay, repeats)


def least_seconds(call: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``call()``, the least of five rounds of ``repeats`` calls."""
    best = math.inf
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(repeats):
            call()
        best = min(best, (time.perf_counter() - start) / repeats)
    return best


def _copy(value):
    if not isinstance(value, torch.Tensor):
        return value
    return value.new_empty_strided(value.shape, value.stride()).copy_(value)


def acting_parts(events, region: str) -> tuple[dict[str, float], int]:
    """Seconds of the profiled ``region`` calls spent in matrix products, in the other ATen
    operations and in the rest (Python and the profiler), and how many operations Python
    called there."""
    regions = [event for event in events if event.name == region]
    parts = {"matrix_products": 0.0, "other_ops": 0.0}
    called = 0
    for event in events:
        parent = event.cpu_parent
        while parent is not None and parent.name != region:
            parent = parent.cpu_parent
        if parent is None or not event.name.startswith("aten::"):
            continue
        part = "matrix_products" if event.name in MATRIX_PRODUCTS else "other_ops"
        parts[part] += event.self_cpu_time_total / 1e6
        called += event.cpu_parent is parent
    parts["python_and_profiler"] = sum(event.cpu_time_total for event in regions) / 1e6 - sum(
        parts.values()
    )
    return parts, called


def other_ops(events, regions: tuple[str, ...], top: int = 10) -> list[dict]:
    """The ATen operations other than matrix products of the profiled ``regions`` that took
    the most self time, with their milliseconds, calls and region."""
    seconds, calls = Counter(), Counter()
    for event in events:
        parent = event.cpu_parent
        while parent is not None and parent.name not in regions:
            parent = parent.cpu_parent
        if parent is None or not event.name.startswith("aten::"):
            continue
        if event.name not in MATRIX_PRODUCTS:
            seconds[parent.name, event.name] += event.self_cpu_time_total / 1e6
            calls[parent.name, event.name] += 1
    return [
        {"op": op, "region": region, "ms": round(s * 1000, 2), "calls": calls[region, op]}
        for (region, op), s in seconds.most_common(top)
    ]


def learner_step(learner: Learner, unroll: Unroll) -> Callable[[bool], None]:
    """One gradient step of ``learner`` as an update takes it, on the first minibatch of an
    epoch over ``unroll``, to call again and again; called with True, its forward pass and
    the rest are the profiler's regions ``forward`` and ``gradient``."""
    learner.agent.train()
    batch = next(learner.epoch(learner.whole_unroll(unroll)))

    def step(regions: bool = False) -> None:
        with torch.profiler.record_function("forward") if regions else nullcontext():
            policy, values, out = learner.forward(batch)
        with torch.profiler.record_function("gradient") if regions else nullcontext():
            learner.gradient_step(batch, policy, values, out)

    return step


def compiled_call_seconds(agent, player: Player, repeats: int = 300) -> float | None:
    """Seconds per step of the compiled step's library (`compile_acting`) called on one
    step's inputs, the least of 5 x ``repeats`` calls; None when acting is not compiled."""
    compiled = agent.compiled_step
    if compiled is None or compiled.runner is None:
        return None
    batch, dtype = player.episode_start.shape[0], agent.value.weight.dtype
    noise = sampling_noise(agent.action_space, batch, dtype, player.device)
    step = (player.obs, player.state, player.episode_start, player.previous, noise)
    tensors = tree_leaves(compiled.plan(agent, *step)[1])
    return least_seconds(lambda: compiled.run(tensors), repeats)


def matrix_rate(size: int = 1024, repeats: int = 10) -> float:
    """GFLOP/s of a float32 (size x size) product on this CPU, on torch's threads."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


class RunParts(NamedTuple):
    """What train_rl.py builds for a run, on the config's device."""

    cfg: DictConfig
    threads: int
    agent: ActorCritic
    learner: Learner
    player: Player
    unroll: Unroll
    bootstrap_truncated: bool


def build_parts(overrides: list[str], threads: str, updates: int) -> RunParts:
    """The envs, agent, learner (its schedule over ``updates``), player and unroll buffers of
    the train_rl.py run of ``overrides``, built as train_rl.py builds them, on ``threads``
    torch threads ("auto" or a number)."""
    register_schemas()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose("rl", overrides=overrides)
    threads = use_host(threads if threads == "auto" else int(threads))
    seed_everything(cfg.seed)
    vec_env = make_vector_env(cfg.env, cfg.num_envs)
    agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
    dist = DistInfo(device=resolve_device(cfg.device))  # one process
    agent.to(dist.device)
    learner = Learner(agent, cfg.agent, updates, dist, cfg.compile_learner or None)
    player = Player(vec_env, agent, EpisodeStats(cfg.num_envs, cfg.env.name))
    player.reset(env_seeds(cfg.seed, 0, cfg.num_envs, "train"))
    unroll = Unroll(player, cfg.unroll_len)
    bootstrap_truncated = not named_env(cfg.env.name).step_limit_ends_episode
    return RunParts(cfg, threads, agent, learner, player, unroll, bootstrap_truncated)


def run_arg_parser(
    description: str, updates: int, warmup: int, example: str
) -> argparse.ArgumentParser:
    """The options of a benchmark of a train_rl.py run: --updates timed after --warmup ones,
    --threads, and the run's overrides (``example``: one to show in the help)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--updates", type=int, default=updates, help="updates timed")
    parser.add_argument("--warmup", type=int, default=warmup, help="updates before timing")
    parser.add_argument("--threads", default="auto", help="torch_threads")
    parser.add_argument("overrides", nargs="*", help=f"train_rl.py overrides, e.g. {example}")
    return parser


def main() -> None:
    parser = run_arg_parser(__doc__.splitlines()[0], updates=30, warmup=10, example="preset=paper")
    args = parser.parse_args()
    run = build_parts(args.overrides, args.threads, args.warmup + args.updates)
    if run.player.device.type != "cpu":
        raise SystemExit(
            f"unroll_time.py measures acting on the CPU, not {run.player.device}: add device=cpu, "
            "or profile the device with benchmarks/update_profile.py"
        )
    cfg, vec_env, agent, learner = run.cfg, run.player.vec_env, run.agent, run.learner
    player, unroll, bootstrap_truncated = run.player, run.unroll, run.bootstrap_truncated

    acting, stepping, learning, collecting = Timer(), Timer(), Timer(), Timer()
    library = Timer()  # the compiled step's library, in acting (`compile_acting`)
    if agent.compiled_step is not None:
        agent.compiled_step.run = library.wrap(agent.compiled_step.run)
    act = agent.act
    agent.act = acting.wrap(act)
    vec_env.step = stepping.wrap(vec_env.step)
    collect = collecting.wrap(collect_unroll)
    update = learning.wrap(learner.update)
    for index in range(args.warmup + args.updates):
        if index == args.warmup:
            for timer in (acting, stepping, learning, collecting, library):
                timer.seconds = 0.0
            memory_sizes, start = [], time.perf_counter()
        collect(agent, player, unroll, SpanStats(), bootstrap_truncated)
        update(unroll, index)
        if index >= args.warmup:
            memory_sizes.append(unroll.memory_size)
    elapsed = time.perf_counter() - start
    per_update = {  # (before the profiled unroll, whose environments step timed too)
        name: round(timer.seconds / args.updates * 1000, 1)
        for name, timer in (("acting", acting), ("envs", stepping), ("learner", learning))
    }
    rest = collecting.seconds - acting.seconds - stepping.seconds
    library_ms = library.seconds / args.updates * 1000
    per_update["other_collecting"] = round(rest / args.updates * 1000, 1)

    def act_as_region(*args, **kwargs):
        with torch.profiler.record_function("acting"):
            return act(*args, **kwargs)

    agent.act = act_as_region  # one more unroll, acting's operations timed
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        collect_unroll(agent, player, unroll, SpanStats(), bootstrap_truncated)
    parts, called = acting_parts(profile.events(), "acting")

    agent.eval()
    recorder = ProductRecorder()
    compiled, agent.compiled_step = agent.compiled_step, None  # (its products are the eager's)
    with FlopCounterMode(display=False) as counter, recorder:
        act(player.obs, player.state, player.episode_start, player.previous)
    agent.compiled_step = compiled
    flops = counter.get_total_flops()
    with acting_threads(cfg.num_envs * agent.value.in_features) as acting_on:
        rate = matrix_rate()
        products_ms = recorder.replay_seconds() * cfg.unroll_len * 1000
        with torch.no_grad():
            compiled_seconds = compiled_call_seconds(agent, player)
    step = learner_step(learner, unroll)
    step()  # (a first call allocates)
    learner_recorder = ProductRecorder()
    with learner_recorder:
        step()
    step_ms = least_seconds(step, repeats=10) * 1000
    learner_products_ms = learner_recorder.replay_seconds(repeats=10) * 1000
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step(regions=True)
    learner_parts = {
        region: acting_parts(profile.events(), region)[0] for region in ("forward", "gradient")
    }
    steps_per_update = cfg.num_envs * cfg.unroll_len
    floor_ms = flops * cfg.unroll_len / (rate * 1e9) * 1000
    result = {
        "overrides": args.overrides,
        "threads": run.threads,
        "num_envs": cfg.num_envs,
        "steps_per_s": round(args.updates * steps_per_update / elapsed),
        "ms_per_update": per_update,
        "memory_size": round(sum(memory_sizes) / len(memory_sizes), 1),
        "acting_threads": acting_on,
        "acting_products_ms": round(products_ms, 1),
        "acting_over_products": round(per_update["acting"] / products_ms, 1),
        "acting_mflops_per_step": round(flops / 1e6, 2),
        "matrix_gflops": round(rate, 1),
        "acting_floor_ms": float(f"{floor_ms:.3g}"),  # (3 significant digits: tiny models)
        "acting_over_floor": round(per_update["acting"] / max(floor_ms, math.ulp(1.0)), 1),
        "acting_profiled_ms": {name: round(seconds * 1000, 1) for name, seconds in parts.items()},
        "acting_ops_per_step": round(called / cfg.unroll_len),
        "learner_step_ms": round(step_ms, 2),
        "learner_products_ms": round(learner_products_ms, 2),
        "learner_step_over_products": round(step_ms / learner_products_ms, 2),
        "learner_profiled_ms": {
            region: {name: round(seconds * 1000, 2) for name, seconds in parts.items()}
            for region, parts in learner_parts.items()
        },
        "learner_other_ops": other_ops(profile.events(), ("forward", "gradient")),
    }
    if compiled_seconds is not None:
        result["acting_compiled_call_ms"] = round(compiled_seconds * cfg.unroll_len * 1000, 1)
        result["acting_library_in_run_ms"] = round(library_ms, 1)
    vec_env.close()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
