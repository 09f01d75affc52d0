"""Which collision questions a model gets right, in groups that show whether it fails because
the collisions it needs lie further back than it remembers.

    python -m analysis.collision_probe CHECKPOINT [--split valid] [--rows 8]

Hard task (the default): questions naming the last collision's colours, by how far back that
collision is, and those naming another pair. A question names the last collision's pair 40% of
the time; its answer lies where that collision is. The other questions' answers lie where their
pair last collided: on a 16 x 16 grid a median of about 4,800 steps (38k tokens) back, beyond
any CPU-sized span, so a model can only guess them.

Easy task (`task.hard=false`): "?last" questions by how far back the last collision is, and
"?recent" questions by how far back the oldest collision they ask (the num_recent-th last) is;
a "?recent" answer is right only if all its quadrants are, as the task scores it.

The split is read as `rows` streams, each from an empty memory, in blocks of K as in
evaluation. Prints one JSON object: the error and count of each group, with the split's
constant-answer and last-collision references.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import torch

from analysis.runs import task_model
from lm.collision import (
    NUM_QUADRANTS,
    CollisionRules,
    CollisionWorld,
    baseline_errors,
    encode,
    split_world,
)
from lm.data import IGNORE
from lm.model import LanguageModel, greedy_predictions, trained_model
from training.config import exit_on_config_error

AGE_BINS = (0, 16, 64, 512)  # steps back: within a block of 128 tokens, of 512, of 4,096 ...
# Easy task, steps back at its 7 tokens a step (num_recent = 3): 0-17 lie within a block's
# length (128 tokens), so need little memory; then edges doubling up to 256 steps (1,792
# tokens), where the small grids the easy task suits put their collisions (a median of 15 steps
# apart on 4 x 4, 64 on 8 x 8). A model remembering S tokens is right up to about S / 7 steps.
EASY_AGE_BINS = (0, 18, 64, 128, 256)


def age_groups(
    label: str, age: np.ndarray, mask: np.ndarray, bins: tuple[int, ...]
) -> dict[str, np.ndarray]:
    """`mask` split by `age` into the bins starting at each edge, the last one open."""
    groups = {}
    for low, high in zip(bins, (*bins[1:], np.inf), strict=True):
        name = f"{label} {low}-{high - 1} steps back" if high < np.inf else f"{label} {low}+"
        groups[name] = mask & (age >= low) & (age < high)
    return groups


def group_errors(
    groups: dict[str, np.ndarray], wrong: np.ndarray
) -> dict[str, dict[str, float | None]]:
    """Error and count of each group of questions (no error for an empty group)."""
    return {
        name: {
            "error": float(wrong[mask].mean()) if mask.any() else None,
            "count": int(mask.sum()),
        }
        for name, mask in groups.items()
    }


def error_groups(
    world: CollisionWorld, rules: CollisionRules, predicted: np.ndarray
) -> dict[str, dict[str, float | None]]:
    """Hard task: error and count of the scored questions among steps 0..len(predicted)-1 by
    group.

    `predicted` holds a quadrant per step (any value where nothing is scored).
    """
    steps = np.arange(len(predicted))
    answers = world.answers[steps, 0]
    last = np.searchsorted(world.collision_steps, steps, side="right") - 1
    collided = world.collision_steps[np.maximum(last, 0)]
    last_pair = world.colours[collided, 0] * rules.num_colors + world.colours[collided, 1]
    names_last = (last >= 0) & (world.questions[steps] == last_pair)
    scored = answers != IGNORE
    groups = {"all": scored, "other pair": scored & ~names_last}
    groups |= age_groups("last pair,", steps - collided, scored & names_last, AGE_BINS)
    return group_errors(groups, predicted != answers)


def easy_error_groups(
    world: CollisionWorld, rules: CollisionRules, predicted: np.ndarray
) -> dict[str, dict[str, float | None]]:
    """Easy task: error and count of the scored questions among steps 0..len(predicted)-1, by
    question and by how far back the oldest collision it needs is (the last one for "?last",
    the num_recent-th last for "?recent").

    `predicted` holds a quadrant per answer slot, shape (steps, num_recent); an answer is right
    only if all its scored slots are.
    """
    steps = np.arange(len(predicted))
    answers = world.answers[steps]
    scored_slots = answers != IGNORE
    scored = scored_slots.any(axis=1)
    wrong = ((predicted != answers) & scored_slots).any(axis=1)
    asks_recent = world.questions[steps] == 1
    last = np.searchsorted(world.collision_steps, steps, side="right") - 1
    oldest = np.where(asks_recent, last - (rules.num_recent - 1), last)
    age = steps - world.collision_steps[np.maximum(oldest, 0)]  # scored: oldest >= 0
    groups = {"all": scored, "?last": scored & ~asks_recent, "?recent": scored & asks_recent}
    groups |= age_groups("?last,", age, groups["?last"], EASY_AGE_BINS)
    groups |= age_groups("?recent, oldest", age, groups["?recent"], EASY_AGE_BINS)
    return group_errors(groups, wrong)


def predicted_quadrants(
    model: LanguageModel, inputs: np.ndarray, rules: CollisionRules, rows: int
) -> np.ndarray:
    """The model's quadrant at each step's answer slots, shape (steps, answers_per_step),
    reading `rows` streams of whole steps (a token other than a quadrant is out of 0..3, so it
    is wrong, as in evaluation)."""
    vocab, step_len = model.head.out_features, rules.tokens_per_step
    per_row = len(inputs) // step_len // rows
    tokens = inputs[: rows * per_row * step_len].reshape(rows, per_row * step_len)
    quadrants = greedy_predictions(model, tokens) - (vocab - NUM_QUADRANTS)  # another token: wrong
    return quadrants.reshape(rows * per_row, step_len)[:, -rules.answers_per_step :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.collision_probe", description=__doc__)
    parser.add_argument("checkpoint", help="checkpoint file or run directory of task=collision")
    parser.add_argument("--split", choices=("train", "valid", "test"), default="valid")
    parser.add_argument("--rows", type=int, default=8, help="streams the split is read as")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    checkpoint, options = task_model(parser, args.checkpoint, "collision")
    world, rules = split_world(options, args.split)
    model = trained_model(checkpoint)
    predicted = predicted_quadrants(model, encode(world, rules).inputs, rules, args.rows)
    if rules.hard:
        groups = error_groups(world, rules, predicted[:, 0])
    else:
        groups = easy_error_groups(world, rules, predicted)
    result = {"split": args.split, **groups}
    result["references"] = baseline_errors(world, rules)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_config_error(main)())  # a damaged checkpoint: one line
