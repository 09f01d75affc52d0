"""Training-step cost of every memory kind on a character-LM-shaped workload, on CPU.

The paper's efficiency claim (Table 4): at the same maximum span, Expire-Span trains faster
and needs less memory than the baselines, because it deletes expired memories and its cost
follows the memories still alive, |C_t|, not L. Here: one training step (forward, backward,
Adam) of a 4-layer, 256-unit core with 4 heads on blocks of 256 random bytes, batch 4,
through a byte embedding and a softmax head, at max span 1024, 4096 and 16384 (``--quick``:
1024 and 4096).

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

Output: one JSON object per line:
{"kind", "max_span", "ms_per_step", "peak_mb", "avg_memory_size"}.

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

import torch
import torch.nn.functional as F
from torch import nn

from memory import MemoryConfig, MemoryState, MemoryTransformer, kind_names
from training.host import return_freed_memory

LAYERS, DIM, HEADS, FFN, BLOCK, BATCH, VOCAB = 4, 256, 4, 1024, 256, 4, 256
RAMP = 128  # R of the paper's character-level models (A.3.4)
COMPRESS_RATE = 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="spans 1024 and 4096 only")
    parser.add_argument("--spans", type=int, nargs="+", help="max spans (default: by --quick)")
    parser.add_argument("--kinds", nargs="+", default=list(kind_names()), choices=kind_names())
    parser.add_argument("--steps", type=int, default=3, help="timed training steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's choice)")
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


def build(kind: str, max_span: int) -> tuple[nn.Module, MemoryTransformer]:
    cfg = MemoryConfig(
        kind=kind,
        num_layers=LAYERS,
        dim=DIM,
        num_heads=HEADS,
        ffn_dim=FFN,
        max_span=max_span,
        block_len=BLOCK,
        ramp=RAMP,
        aux_loss_coef=1e-6,
        init_span_fraction=0.1,
        compress_rate=COMPRESS_RATE,
        compressed_span=max_span // COMPRESS_RATE,
    )
    core = MemoryTransformer(cfg)
    if kind == "expire_span":  # spans as after training: short on average, all different
        with torch.no_grad():
            for layer in core.layers:
                layer.kind.predictor.linear.weight.normal_(0, 0.5 / math.sqrt(DIM))
    model = nn.ModuleDict(
        dict(embed=nn.Embedding(VOCAB, DIM), core=core, head=nn.Linear(DIM, VOCAB))
    )
    return model, core


def train_step(model: nn.ModuleDict, optimizer: torch.optim.Optimizer, state: MemoryState):
    """Forward, backward and Adam step on a block of random bytes; returns the core output."""
    data = torch.randint(VOCAB, (state.batch_size, BLOCK + 1))
    out = model["core"](model["embed"](data[:, :-1]), state)
    logits = model["head"](out.hidden)
    loss = F.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1)) + out.aux_loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return out


def settled_rss(kind: str) -> float | None:
    """RSS once the math libraries' code is loaded (one small step of the same model)."""
    model, core = build(kind, BLOCK)
    train_step(model, torch.optim.Adam(model.parameters()), core.initial_state(1))
    del model, core
    gc.collect()
    return megabytes("VmRSS")


def measure(kind: str, max_span: int, steps: int) -> dict:
    torch.manual_seed(0)
    baseline = settled_rss(kind)
    model, core = build(kind, max_span)
    optimizer = torch.optim.Adam(model.parameters(), lr=7e-4)
    state = core.initial_state(BATCH)

    # warm up to the steady state: until the oldest memory the kind can keep has been written
    compressed_reach = (max_span // COMPRESS_RATE) * COMPRESS_RATE
    reach = max_span + {"compressive": compressed_reach, "transformer_xl": 0}.get(kind, RAMP)
    with torch.no_grad():
        for _ in range(math.ceil(reach / BLOCK) + 1):
            state = core(model["embed"](torch.randint(VOCAB, (BATCH, BLOCK))), state).state
    state = train_step(model, optimizer, state).state  # allocates Adam's state

    times, sizes = [], []
    for _ in range(steps):
        start = time.perf_counter()
        out = train_step(model, optimizer, state)
        times.append(time.perf_counter() - start)
        sizes.append(out.memory_size)
        state = out.state

    exact = return_freed_memory() and reset_peak()
    for _ in range(steps):
        out = train_step(model, optimizer, state)
        sizes.append(out.memory_size)
        state = out.state
    peak = megabytes("VmHWM") if exact else lifetime_peak_mb()
    return {
        "kind": kind,
        "max_span": max_span,
        "ms_per_step": round(1000 * sorted(times)[len(times) // 2], 1),
        "peak_mb": round(peak - (baseline or 0.0), 1),
        "avg_memory_size": round(sum(sizes) / len(sizes), 1),
    }


def main() -> None:
    args = parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        kind, span = args.child
        print(json.dumps(measure(kind, int(span), args.steps)), flush=True)
        return
    spans = args.spans or ([1024, 4096] if args.quick else [1024, 4096, 16384])
    for span in spans:
        for kind in args.kinds:
            command = [sys.executable, os.path.abspath(__file__), "--child", kind, str(span)]
            command += ["--steps", str(args.steps), "--threads", str(args.threads)]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"{kind} at max span {span} failed:\n{result.stderr}")
            print(result.stdout.strip(), flush=True)


if __name__ == "__main__":
    main()
