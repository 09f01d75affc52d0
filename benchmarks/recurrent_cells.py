"""The recurrent baselines' layers alone on this CPU: PyTorch's GRU and LSTM against the
project's GRU (`agents.recurrent.GRULayers`), in the learner's shape (forward and backward
over a block) and the actor's (one step, no gradients).

    python benchmarks/recurrent_cells.py [--batch 8] [--block 100] [--envs 16] [--dim 64]

The defaults are PPO's minibatch on POPGym (8 environments x BPTT 100, a 64-unit core) and its
16 acting environments. Prints one JSON object: milliseconds per call of each layer in each
shape (the median of `--repeats`), and the GRUs' ratio to PyTorch's GRU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from functools import partial

import torch
from torch import nn

from agents.recurrent import GRULayers
from training.host import use_host


def median_ms(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", default="auto", help="torch threads (auto: the cores)")
    args = parser.parse_args()
    use_host(args.threads if args.threads == "auto" else int(args.threads))
    torch.manual_seed(0)
    d, n = args.dim, args.layers
    layers = {
        "torch_gru": nn.GRU(d, d, n, batch_first=True),
        "project_gru": GRULayers(d, n),
        "torch_lstm": nn.LSTM(d, d, n, batch_first=True),
    }
    x = torch.randn(args.batch, args.block, d)
    step_x = torch.randn(args.envs, 1, d)

    def zeros(name: str, batch: int):
        h = torch.zeros(n, batch, d)
        return (h, h.clone()) if name == "torch_lstm" else h

    def learn(name: str) -> None:
        out, _ = layers[name](x, zeros(name, args.batch))
        out.sum().backward()

    def act(name: str) -> None:
        with torch.no_grad():
            layers[name](step_x, zeros(name, args.envs))

    result = {**vars(args), "threads": torch.get_num_threads()}
    for name in layers:
        result[f"{name}_learn_ms"] = median_ms(partial(learn, name), args.repeats)
        result[f"{name}_act_ms"] = median_ms(partial(act, name), args.repeats)
    for shape in ("learn", "act"):
        reference = result[f"torch_gru_{shape}_ms"]
        result[f"project_gru_{shape}_ratio"] = result[f"project_gru_{shape}_ms"] / reference
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
