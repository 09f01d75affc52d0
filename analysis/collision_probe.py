"""Which collision questions a model gets right: those naming the last collision's colours, by
how far back that collision is, and those naming another pair.

    python -m analysis.collision_probe CHECKPOINT [--split valid] [--rows 8]

A question names the last collision's pair 40% of the time; its answer lies where that
collision is. The other questions' answers lie where their pair last collided: on a 16 x 16
grid a median of about 4,800 steps (38k tokens) back, beyond any CPU-sized span, so a model
can only guess them. The split is read as `rows` streams, each from an empty memory, in blocks
of K as in evaluation. Prints one JSON object: the error and count of each group, with the
split's constant-answer and last-collision references.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from analysis.runs import LM, require_run_kind
from lm.collision import (
    NUM_QUADRANTS,
    CollisionRules,
    CollisionWorld,
    baseline_errors,
    encode,
    split_world,
)
from lm.data import IGNORE
from lm.model import LanguageModel, trained_model
from lm.tasks import task_options
from training import load_checkpoint
from training.config import exit_on_config_error

AGE_BINS = (0, 16, 64, 512)  # steps back: within a block of 128 tokens, of 512, of 4,096 ...


def error_groups(
    world: CollisionWorld, rules: CollisionRules, predicted: np.ndarray
) -> dict[str, dict[str, float]]:
    """Error and count of the scored questions among steps 0..len(predicted)-1 by group.

    `predicted` holds a quadrant per step (any value where nothing is scored).
    """
    steps = np.arange(len(predicted))
    answers = world.answers[steps, 0]
    last = np.searchsorted(world.collision_steps, steps, side="right") - 1
    collided = world.collision_steps[np.maximum(last, 0)]
    last_pair = world.colours[collided, 0] * rules.num_colors + world.colours[collided, 1]
    names_last = (last >= 0) & (world.questions[steps] == last_pair)
    age = steps - collided
    scored = answers != IGNORE
    wrong = predicted != answers
    groups = {"all": scored, "other pair": scored & ~names_last}
    for low, high in zip(AGE_BINS, (*AGE_BINS[1:], np.inf), strict=True):
        name = f"last pair, {low}-{high - 1} steps back" if high < np.inf else f"last pair, {low}+"
        groups[name] = scored & names_last & (age >= low) & (age < high)
    return {
        name: {
            "error": float(wrong[mask].mean()) if mask.any() else None,
            "count": int(mask.sum()),
        }
        for name, mask in groups.items()
    }


@torch.no_grad()
def predicted_quadrants(
    model: LanguageModel, inputs: np.ndarray, tokens_per_step: int, rows: int
) -> np.ndarray:
    """The model's quadrant at each step's answer slot, reading `rows` streams of whole steps
    (a token other than a quadrant is out of 0..3, so it is wrong, as in evaluation)."""
    vocab = model.head.out_features
    per_row = len(inputs) // tokens_per_step // rows
    tokens = torch.from_numpy(inputs[: rows * per_row * tokens_per_step].astype(np.int64))
    tokens = tokens.view(rows, per_row * tokens_per_step)
    state, answers = model.initial_state(rows), []
    for start in range(0, tokens.shape[1], model.cfg.block_len):
        logits, out = model(tokens[:, start : start + model.cfg.block_len], state)
        state = out.state
        answers.append(logits.argmax(-1) - (vocab - NUM_QUADRANTS))  # another token: wrong
    slots = torch.cat(answers, dim=1).view(rows, per_row, tokens_per_step)
    return slots[:, :, -1].flatten().numpy()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.collision_probe", description=__doc__)
    parser.add_argument("checkpoint", help="checkpoint file or run directory of task=collision")
    parser.add_argument("--split", choices=("train", "valid", "test"), default="valid")
    parser.add_argument("--rows", type=int, default=8, help="streams the split is read as")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoint = load_checkpoint(args.checkpoint)
    if checkpoint is None:
        parser.error(f"{args.checkpoint}: no checkpoint file there")
    require_run_kind(parser.prog, args.checkpoint, checkpoint.get("config", {}), LM)
    task = dict(checkpoint["config"]["task"])
    if task.pop("name") != "collision" or not task.get("hard", True):
        parser.error(f"{args.checkpoint} is not a model of the hard collision task")
    world, rules = split_world(task_options("collision") | task, args.split)
    model = trained_model(checkpoint)
    predicted = predicted_quadrants(
        model, encode(world, rules).inputs, rules.tokens_per_step, args.rows
    )
    result = {"split": args.split, **error_groups(world, rules, predicted)}
    result["references"] = baseline_errors(world, rules)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_config_error(main)())  # a damaged checkpoint: one line
