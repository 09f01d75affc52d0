"""Which executions an instruction model gets right: by the part of the line it misses, and by
how far back the instruction was, to show whether it fails for want of memory.

    python -m analysis.instruction_probe CHECKPOINT [--split valid] [--rows 8] [--tokens N]

An execution `you tell the X " Y wants to see you ! "` is right only if every token is. Three
parts of it come from the instruction, hundreds of tokens back; the rest follows from the line
once it has begun:
- "whether": its first token, that an instruction is due here (other lines begin with "you"
  too, but the line after a presence line is an execution only when one is due);
- "receiver": X's words, which of the characters present was asked for;
- "sender": Y's words, who asked (the task's hardest part: one of the characters, told once).
Executions are also grouped by distance, the tokens from the end of the instruction line to
the start of its execution, in bins of K, 2K, 4K and 8K tokens (K: the model's block): from
K on, the instruction lies beyond its relative positions, in memory.

The split (or its first `tokens` positions) is read as `rows` streams, each from an empty
memory, in blocks of K, as evaluation reads it: with the run's `eval_batch_size` rows and
`valid_prefix` tokens the overall accuracy is the run's valid_accuracy. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from analysis.runs import task_model
from lm.data import IGNORE, Split
from lm.instruction import Instruction, encode_story, split_story, tokenize
from lm.model import greedy_predictions, trained_model
from training.config import exit_on_config_error

PARTS = ("whether", "receiver", "sender")
DISTANCE_BINS = (0, 1, 2, 4, 8)  # in blocks of K


def part_offsets(instruction: Instruction) -> dict[str, slice]:
    """Where each part lies in the execution's tokens (`you tell the X " Y wants ...`)."""
    receiver = len(tokenize(instruction.receiver))
    sender = len(tokenize(instruction.sender))
    return {
        "whether": slice(0, 1),
        "receiver": slice(3, 3 + receiver),
        "sender": slice(4 + receiver, 4 + receiver + sender),
    }


def grouped_accuracy(right: dict[str, list[bool]]) -> dict[str, dict[str, float]]:
    return {name: {"accuracy": float(np.mean(r)), "count": len(r)} for name, r in right.items()}


def execution_accuracy(
    instructions: list[Instruction], split: Split, predicted: np.ndarray, block_len: int
) -> dict:
    """Accuracy of the executions that lie whole within the stream `predicted` (a prediction per
    position of `split`, 1-D): overall, by part, and by distance to the instruction."""
    bins = [edge * block_len for edge in DISTANCE_BINS]
    labels = [f"{lo}-{hi - 1}" for lo, hi in zip(bins, bins[1:], strict=False)] + [f"{bins[-1]}+"]
    parts: dict[str, list[bool]] = {part: [] for part in PARTS}
    by_distance: dict[str, list[bool]] = {label: [] for label in labels}
    overall = []
    for instruction in instructions:
        if instruction.executed is None or instruction.executed[1] - 1 > len(predicted):
            continue
        start, stop = instruction.executed
        positions = np.arange(start - 1, stop - 1)  # position t predicts token t + 1
        scored = split.targets[positions] != IGNORE
        correct = predicted[positions] == split.targets[positions]
        whole = bool(correct[scored].all())
        overall.append(whole)
        for part, where in part_offsets(instruction).items():
            parts[part].append(bool(correct[where].all()))
        distance = start - instruction.given_end
        by_distance[labels[np.searchsorted(bins, distance, side="right") - 1]].append(whole)
    return {
        "accuracy": float(np.mean(overall)) if overall else float("nan"),
        "count": len(overall),
        "parts": grouped_accuracy(parts),
        "by_distance": grouped_accuracy({k: v for k, v in by_distance.items() if v}),
    }


def main(argv: list[str] | None = None) -> int:
    prog = "python -m analysis.instruction_probe"
    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
    parser.add_argument("checkpoint", help="checkpoint file or run directory of task=instruction")
    parser.add_argument("--split", choices=("train", "valid", "test"), default="valid")
    parser.add_argument("--rows", type=int, default=8, help="streams the split is read as")
    parser.add_argument("--tokens", type=int, default=None, help="read this prefix (default: all)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoint, options = task_model(parser, args.checkpoint, "instruction")
    story = split_story(options, args.split)
    split = encode_story(story, checkpoint["vocab"])
    rows = (split.head(args.tokens) if args.tokens else split).batchify(args.rows)
    model = trained_model(checkpoint)
    predicted = greedy_predictions(model, rows.inputs).reshape(-1)
    result = execution_accuracy(story.instructions, split, predicted, model.cfg.block_len)
    print(json.dumps({"split": args.split, "block_len": model.cfg.block_len, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_config_error(main)())  # a damaged checkpoint: one line
