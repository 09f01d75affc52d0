"""Training-step cost of every memory kind on a character-LM-shaped workload.

The paper's efficiency claim (Table 4): at the same maximum span, Expire-Span trains faster
and needs less memory than the baselines, because it deletes expired memories and its cost
follows the memories still alive, |C_t|, not L. Here: one training step (forward, backward,
Adam) of a language model on blocks of random bytes, through a byte embedding and a softmax
head, at max span 1024, 4096 and 16384 (``--quick``: 1024 and 4096). ``--workload`` names its
sizes (WORKLOADS): ``cpu``, the default, a 4-layer, 256-unit core with 4 heads on blocks of
256, batch 4; ``instruction``, the paper's instruction model (A.3.2: 6 layers of 512, 8 heads,
R = 64; table 5); ``instruction_cpu``, the model of the instruction runs here (4 layers of 128,
4 heads, blocks of 64, batch 16, R = 32); ``enwik8``, the paper's enwik8-sized core (12 layers
of 512, 8 heads, blocks of 512, batch 8), which `benchmarks/lm_gpu.py` runs on a GPU.
``--device cuda`` measures on the GPU (peak memory: torch's allocator), ``--precision bf16``
autocasts the step to bfloat16 as `train_lm.py precision=bf16` does, ``--compile MODE``
compiles its forward and backward as `train_lm.py compile_step=MODE` does (the memory compacted
and padded to few lengths before every step, `MemoryState.compacted`; two more untimed steps
compile it).

State measured: the memory is warmed up to its steady state first (no-grad blocks until
the oldest memory the kind can keep has been written), then one untimed training step
allocates Adam's state, then ``--steps`` steps are timed (median reported) and ``--steps``
more measure the peak memory. Expire-Span is
measured in the state training leads to: spans learned short. The span predictor's bias is
set so the average span is L/10 (the paper reports average memory sizes around a tenth of
L after training) and w is random with w.h of standard deviation 0.5, so spans differ from
memory to memory and the memory has holes, as after training. Adaptive-Span is measured at
its initial spans (0.1 L for every head), Compressive with c = 4 and L/4 compressed memories.

Peak memory: each configuration runs in a fresh subprocess so peaks don't mix. There the
resident set size (RSS) is read from /proc/self/status before the model is built (after one
small step of a throwaway copy, so the math libraries' code is already loaded). After the
timed steps, glibc is told to serve large blocks with mmap (mallopt M_MMAP_THRESHOLD =
128 KiB) and to return its free memory (malloc_trim), so freed tensors go back to the
operating system and the RSS follows live memory rather than the allocator's cache (not
during the timed steps: the page faults would slow them). The peak RSS (VmHWM, reset
through /proc/self/clear_refs) over the following steps minus the RSS before the model is
``peak_mb``: parameters, Adam state, stored memories, and the step's activations and
gradients. Without /proc or glibc (e.g. macOS) it falls back to the process's lifetime
maximum RSS from ``resource``, which includes the warm-up and the allocator's cache.

Timing runs on one thread by default (``--threads``): on a machine shared with other jobs,
OpenMP's barriers make multi-threaded small kernels erratic, and one core is the unit the
project's CPU figures use.

On CUDA the peak is the allocator's (`torch.cuda.max_memory_allocated`) over the same steps,
less what was allocated before the model was built.

Output: one JSON object per line: {"kind", "max_span", "ms_per_step", "tokens_per_s",
"peak_mb", "avg_memory_size", "workload", "device", "precision", "compile"}; with ``--profile`` also
"profile": one more step under torch.profiler, per part ("forward", "backward", "optimizer"):
the operations Python called, the host reads of a tensor's value (each a wait on a GPU), the
operations of the most host time, and on a GPU the kernel launches, kernels, their device time
and the host's waits; on a GPU also "sync_sites", where in the project's code a step waited.

    python benchmarks/memory_efficiency.py --quick
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from profiling import profile_parts, sync_sites, synchronize
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

from memory import CoreOutput, MemoryConfig, MemoryState, MemoryTransformer, kind_names
from training.config import COMPILE_MODES
from training.host import return_freed_memory

VOCAB = 256
COMPRESS_RATE = 4
STEP_PARTS = ("forward", "backward", "optimizer")  # a training step's parts (--profile)


@dataclass(frozen=True)
class Workload:
    """The sizes of the model and the batch of one training step."""

    layers: int
    dim: int
    heads: int
    ffn: int
    block: int
    batch: int
    ramp: int  # R: 128 in the paper's character-level models (A.3.4), 64 on instruction


WORKLOADS = {
    "cpu": Workload(layers=4, dim=256, heads=4, ffn=1024, block=256, batch=4, ramp=128),
    "instruction": Workload(layers=6, dim=512, heads=8, ffn=2048, block=256, batch=4, ramp=64),
    # the instruction task's CPU scale (configs/lm.yaml's model, blocks of 64, 16 streams):
    # table 5 beside the accuracies of scripts/instruction_memory.sh
    "instruction_cpu": Workload(layers=4, dim=128, heads=4, ffn=512, block=64, batch=16, ramp=32),
    "enwik8": Workload(layers=12, dim=512, heads=8, ffn=2048, block=512, batch=8, ramp=128),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="spans 1024 and 4096 only")
    parser.add_argument("--spans", type=int, nargs="+", help="max spans (default: by --quick)")
    parser.add_argument("--kinds", nargs="+", default=list(kind_names()), choices=kind_names())
    parser.add_argument("--steps", type=int, default=3, help="timed training steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
    parser.add_argument("--workload", default="cpu", choices=WORKLOADS, help="model and batch")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument(
        "--compile",
        choices=COMPILE_MODES,
        help="the step's forward and backward under torch.compile, as train_lm.py compile_step",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also profile one step: operations, host reads, (GPU) launches and kernels",
    )
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SPAN"), help=argparse.SUPPRESS)
    return parser.parse_args()


def megabytes(field: str) -> float | None:
    """A field of /proc/self/status in MB, None where /proc is missing."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) / 1024


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def lifetime_peak_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024  # bytes vs kB


def build(kind: str, max_span: int, work: Workload) -> tuple[nn.Module, MemoryTransformer]:
    cfg = MemoryConfig(
        kind=kind,
        num_layers=work.layers,
        dim=work.dim,
        num_heads=work.heads,
        ffn_dim=work.ffn,
        max_span=max_span,
        block_len=work.block,
        ramp=work.ramp,
        aux_loss_coef=1e-6,
        init_span_fraction=0.1,
        compress_rate=COMPRESS_RATE,
        compressed_span=max_span // COMPRESS_RATE,
    )
    core = MemoryTransformer(cfg)
    if kind == "expire_span":  # spans as after training: short on average, all different
        with torch.no_grad():
            for layer in core.layers:
                layer.kind.predictor.linear.weight.normal_(0, 0.5 / math.sqrt(work.dim))
    model = nn.ModuleDict(
        dict(embed=nn.Embedding(VOCAB, work.dim), core=core, head=nn.Linear(work.dim, VOCAB))
    )
    return model, core


def forward_loss(
    model: nn.ModuleDict, data: torch.Tensor, state: MemoryState, bf16: bool
) -> tuple[torch.Tensor, CoreOutput]:
    """The loss of predicting each byte of ``data`` (B, K + 1) from those before it."""
    with torch.autocast(state.device.type, torch.bfloat16) if bf16 else nullcontext():
        out = model["core"](model["embed"](data[:, :-1]), state)
        logits = model["head"](out.hidden)
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1))
    return loss + out.aux_loss, out


def train_step(
    model: nn.ModuleDict,
    optimizer: torch.optim.Optimizer,
    state: MemoryState,
    bf16: bool,
    forward: Callable = forward_loss,
) -> CoreOutput:
    """Forward (``forward_loss``, or its compiled version), backward and Adam step on a block
    of random bytes; returns the core output."""
    block = model["core"].cfg.block_len
    data = torch.randint(VOCAB, (state.batch_size, block + 1), device=state.device)
    with record_function("forward"):
        if state.fixed_shapes:  # a compiled step's: its dead memories deleted, padded again
            state = state.compacted()
        loss, out = forward(model, data, state, bf16)
    optimizer.zero_grad(set_to_none=True)
    with record_function("backward"):
        loss.backward()
    with record_function("optimizer"):
        optimizer.step()
    return out


def settled_rss(kind: str, work: Workload, device: torch.device) -> float | None:
    """RSS once the math libraries' code is loaded (one small step of the same model); on
    CUDA, the bytes the allocator holds then (none)."""
    model, core = build(kind, work.block, work)
    model.to(device)
    train_step(model, torch.optim.Adam(model.parameters()), core.initial_state(1, device), False)
    del model, core
    gc.collect()
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return megabytes("VmRSS")


def measure(kind: str, max_span: int, steps: int, args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    work, device, bf16 = (
        WORKLOADS[args.workload],
        torch.device(args.device),
        args.precision == "bf16",
    )
    cuda = device.type == "cuda"
    baseline = settled_rss(kind, work, device)
    model, core = build(kind, max_span, work)
    model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=7e-4)
    state = core.initial_state(work.batch, device)

    # warm up to the steady state: until the oldest memory the kind can keep has been written
    compressed_reach = (max_span // COMPRESS_RATE) * COMPRESS_RATE
    reach = max_span + {"compressive": compressed_reach, "transformer_xl": 0}.get(kind, work.ramp)
    with torch.no_grad():
        for _ in range(math.ceil(reach / work.block) + 1):
            data = torch.randint(VOCAB, (work.batch, work.block), device=device)
            state = core(model["embed"](data), state).state
    forward = forward_loss
    if args.compile:  # from a memory of few shapes, each compiled in the steps before timing
        state = state.compacted()
        forward = torch.compile(forward_loss, mode=args.compile, dynamic=False)
    for _ in range(3 if args.compile else 1):  # the first allocates Adam's state
        state = train_step(model, optimizer, state, bf16, forward).state

    times, sizes = [], []
    for _ in range(steps):
        synchronize(device)
        start = time.perf_counter()
        out = train_step(model, optimizer, state, bf16, forward)
        synchronize(device)
        times.append(time.perf_counter() - start)
        sizes.append(float(out.memory_size))
        state = out.state

    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    exact = cuda or (return_freed_memory() and reset_peak())
    for _ in range(steps):
        out = train_step(model, optimizer, state, bf16, forward)
        sizes.append(float(out.memory_size))
        state = out.state
    if cuda:
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = megabytes("VmHWM") if exact else lifetime_peak_mb()
    seconds = sorted(times)[len(times) // 2]
    result = {
        "kind": kind,
        "max_span": max_span,
        "ms_per_step": round(1000 * seconds, 1),
        "tokens_per_s": round(work.batch * work.block / seconds),
        "peak_mb": round(peak - (baseline or 0.0), 1),
        "avg_memory_size": round(sum(sizes) / len(sizes), 1),
        "workload": args.workload,
        "device": str(device),
        "precision": args.precision,
        "compile": args.compile or False,
    }
    if args.profile:
        result["profile"] = profile_step(model, optimizer, out.state, bf16, forward)
    return result


def profile_step(
    model: nn.ModuleDict,
    optimizer: torch.optim.Optimizer,
    state: MemoryState,
    bf16: bool,
    forward: Callable,
) -> dict:
    """One more training step under torch.profiler, per part (`profiling.profile_parts`), and
    on a GPU where another step waited for it (`profiling.sync_sites`)."""
    device = state.device
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    synchronize(device)
    with profile(activities=activities) as profiled:
        state = train_step(model, optimizer, state, bf16, forward).state
        synchronize(device)
    summary = profile_parts(profiled.events(), device, STEP_PARTS)
    if device.type == "cuda":
        summary["sync_sites"] = sync_sites(
            lambda: train_step(model, optimizer, state, bf16, forward)
        )
    return summary


def main() -> None:
    args = parse_args()
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        kind, span = args.child
        print(json.dumps(measure(kind, int(span), args.steps, args)), flush=True)
        return
    spans = args.spans or ([1024, 4096] if args.quick else [1024, 4096, 16384])
    for span in spans:
        for kind in args.kinds:
            command = [sys.executable, os.path.abspath(__file__), "--child", kind, str(span)]
            command += ["--steps", str(args.steps), "--threads", str(args.threads)]
            command += ["--workload", args.workload, "--device", args.device]
            command += ["--precision", args.precision] + (["--profile"] if args.profile else [])
            command += ["--compile", args.compile] if args.compile else []
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"{kind} at max span {span} failed:\n{result.stderr}")
            print(result.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
