"""Which part of an agent lost (or found) a task between two of its checkpoints.

    python -m analysis.module_swap BEFORE.pt AFTER.pt [--episodes N] [--greedy] [--seed S]

Between two checkpoints of a run every parameter moved: the encoder, each layer's attention,
span predictor and FFN, the heads. This evaluates BEFORE and AFTER, then, for each of those
module groups, BEFORE with the group's parameters taken from AFTER and AFTER with them taken
from BEFORE, all on the same episodes (same environment seeds, same sampling seed). A group
whose swap carries the outcome of AFTER one way and restores that of BEFORE the other is
where the change that mattered happened; a change spread over many groups carries little of
it either way. Prints one JSON line per evaluation: `mode=eval`'s outcome (success, memory
size, on the Corridor success by length and by case) with `agent` ("before", "after",
"before+after[GROUP]" or "after+before[GROUP]").
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from omegaconf import OmegaConf

from agents.build import build_agent
from agents.evaluation import evaluate_agent
from envs.registry import env_spaces
from training.checkpoint import load_checkpoint
from training.config import exit_on_config_error

Parameters = dict[str, torch.Tensor]


def module_group(name: str) -> str:
    """The group of a parameter: a transformer layer's attention (with its norm), memory kind
    (Expire-Span's span predictor) or FFN (with its norm); else the agent's top-level module
    (``encoder``, ``policy``, ``value``...) or the core's (``core.final_norm``, ``core.rnn``)."""
    parts = name.split(".")
    if parts[:2] == ["core", "layers"]:
        return ".".join([*parts[:3], parts[3].removesuffix("_norm")])
    return ".".join(parts[:2]) if parts[0] == "core" else parts[0]


def module_groups(parameters: Parameters) -> list[str]:
    """The groups of ``parameters``, in the agent's order."""
    return list(dict.fromkeys(module_group(name) for name in parameters))


def swapped(base: Parameters, other: Parameters, group: str) -> Parameters:
    """``base`` with the parameters of ``group`` taken from ``other``."""
    return {name: (other if module_group(name) == group else base)[name] for name in base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path, help="a checkpoint file (e.g. checkpoint_<step>.pt)")
    parser.add_argument("after", type=Path, help="a later checkpoint of the same agent")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per evaluation")
    parser.add_argument("--greedy", action="store_true", help="greedy actions (default: sampled)")
    parser.add_argument("--seed", type=int, default=0, help="environment and sampling seed")
    args = parser.parse_args()
    checkpoints = []
    for path in (args.before, args.after):
        checkpoint = load_checkpoint(path)
        if checkpoint is None or "agent" not in checkpoint:
            parser.error(f"{path}: not an agent checkpoint of train_rl.py")
        checkpoints.append(checkpoint)
    before, after = (checkpoint["agent"] for checkpoint in checkpoints)
    shapes = [{name: tuple(value.shape) for name, value in p.items()} for p in (before, after)]
    if shapes[0] != shapes[1]:
        parser.error(f"{args.before} and {args.after} are not the same agent (parameters differ)")

    cfg = OmegaConf.create(checkpoints[0]["config"])
    agent = build_agent(cfg, *env_spaces(cfg.env))
    eval_cfg = OmegaConf.merge(cfg.eval, {"episodes": args.episodes})

    def evaluate(name: str, parameters: Parameters) -> None:
        agent.load_state_dict(parameters)
        torch.manual_seed(args.seed)  # the same action samples for every evaluation
        outcome = evaluate_agent(agent, cfg.env, eval_cfg, args.seed, args.greedy)
        outcome.pop("spans", None)
        print(json.dumps({"agent": name, **outcome}), flush=True)

    evaluate("before", before)
    evaluate("after", after)
    for group in module_groups(before):
        evaluate(f"before+after[{group}]", swapped(before, after, group))
        evaluate(f"after+before[{group}]", swapped(after, before, group))


if __name__ == "__main__":
    exit_on_config_error(main)()  # a damaged checkpoint: one line
