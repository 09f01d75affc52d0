"""Recall at a distance on the memory core alone: does a learned expire-span hold?

A cue bit at t = 0, random distractor tokens, a query token at t = d ~ U(d_min, d_max); the
answer, read out at the query, is the cue bit. Memories must live d steps for the cue and
none for the distractors, and the span penalty acts at every optimiser step while the task
gradient fades once the answer is learned: the situation in which RL runs lose their spans,
at a scale that runs in a minute or two.

    python benchmarks/span_recall.py --steps 4000 --seed 1
    python benchmarks/span_recall.py --span-lr-scale 0.1

Prints one JSON object every --log steps: task loss and accuracy of the step's batch, the
accuracy on a fixed batch queried at d_max (the distance a span that falls short fails
first), the cue memory's span and the mean span of the distractors' memories, per layer, and
the average memory size. ``train`` yields the same records, for scripts.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import torch
from torch import nn

from agents.update import make_optimizer
from memory import CoreOutput, MemoryConfig, MemoryTransformer

CUE_TOKENS, DISTRACTORS = 2, 8
QUERY = CUE_TOKENS + DISTRACTORS


class RecallModel(nn.Module):
    """Token embedding, the memory core, a linear read-out of the cue bit."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(QUERY + 1, cfg.dim)
        self.core = MemoryTransformer(cfg)
        self.readout = nn.Linear(cfg.dim, CUE_TOKENS)


def batch(size: int, length: int, d_min: int, d_max: int) -> tuple[torch.Tensor, ...]:
    """Tokens (B, length), the cue bits (B,) and the query times (B,)."""
    bits = torch.randint(0, CUE_TOKENS, (size,))
    query_at = torch.randint(d_min, d_max + 1, (size,))
    tokens = torch.randint(CUE_TOKENS, QUERY, (size, length))
    tokens[:, 0] = bits
    tokens[torch.arange(size), query_at] = QUERY
    return tokens, bits, query_at


def train(
    steps: int = 4000,
    seed: int = 0,
    batch_size: int = 32,
    d_min: int = 20,
    d_max: int = 40,
    length: int = 100,
    max_span: int = 100,
    ramp: float = 4.0,
    alpha: float = 1e-3,
    lr: float = 5e-3,
    layers: int = 1,
    log: int = 250,
) -> Iterator[dict]:
    """Train the recall model; every ``log`` steps yield a record of the step's batch and of
    a fixed batch whose query is at the longest distance, ``d_max``."""
    if not 0 < d_min <= d_max < length:
        raise ValueError("need 0 < d_min <= d_max < length")
    torch.manual_seed(seed)
    cfg = MemoryConfig(
        kind="expire_span",
        num_layers=layers,
        dim=16,
        num_heads=2,
        ffn_dim=32,
        max_span=max_span,
        block_len=length,
        ramp=ramp,
        aux_loss_coef=alpha,
        init_span_fraction=0.5,
    )
    model = RecallModel(cfg)
    optimizer = make_optimizer(model, "adam", lr)
    far_tokens, far_bits, far_query_at = batch(256, length, d_max, d_max)
    for step in range(1, steps + 1):
        tokens, bits, query_at = batch(batch_size, length, d_min, d_max)
        out, logits = recall(model, tokens, query_at)
        task = nn.functional.cross_entropy(logits, bits)
        optimizer.zero_grad()
        (task + out.aux_loss).backward()
        optimizer.step()
        if step % log == 0:
            with torch.no_grad():
                _, far_logits = recall(model, far_tokens, far_query_at)
            yield {
                "step": step,
                "loss": task.item(),
                "accuracy": (logits.argmax(-1) == bits).float().mean().item(),
                "accuracy_at_d_max": (far_logits.argmax(-1) == far_bits).float().mean().item(),
                "cue_span": [span[:, 0].mean().item() for span in out.spans],
                "distractor_span": [span[:, 1:].mean().item() for span in out.spans],
                "memory_size": float(out.memory_size),
            }


def recall(
    model: RecallModel, tokens: torch.Tensor, query_at: torch.Tensor
) -> tuple[CoreOutput, torch.Tensor]:
    """The core's output on ``tokens`` (B, length) and the read-out logits at ``query_at``."""
    out = model.core(model.embed(tokens), model.core.initial_state(tokens.shape[0]))
    return out, model.readout(out.hidden[torch.arange(tokens.shape[0]), query_at])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--d-min", type=int, default=20)
    parser.add_argument("--d-max", type=int, default=40)
    parser.add_argument("--length", type=int, default=100, help="sequence (one block) length")
    parser.add_argument("--max-span", type=int, default=100)
    parser.add_argument("--ramp", type=float, default=4.0)
    parser.add_argument("--alpha", type=float, default=1e-3, help="span penalty coefficient")
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--log", type=int, default=250)
    args = parser.parse_args()
    torch.set_num_threads(1)
    options = {k.replace("-", "_"): v for k, v in vars(args).items()}
    options["batch_size"] = options.pop("batch")
    try:
        for record in train(**options):
            print(json.dumps(record), flush=True)
    except ValueError as error:
        parser.error(str(error))


if __name__ == "__main__":
    main()
