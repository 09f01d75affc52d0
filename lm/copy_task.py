"""Extremely long copy (paper 5.3, table 1): reproduce how many A's came long ago.

The stream is a sequence of independent episodes, each

    A x n   B x distance   =   A x n   .

with n uniform in 1..max_count. After the query token `=` the model must write the run of
A's again, exactly n of them, then `.`. Only those n + 1 tokens are targets (one answer span
per episode, right only if all are right); every other target is ignored, since the rest
of the stream is noise or fixed filler.

The last decision, to write `.` instead of another A, needs n, which only the first run
tells. From the last answer token the first A of that run is distance + 2n tokens back, so
a model that sees at least distance + 2 * max_count tokens back can reach 100%, and one that
sees fewer than `distance` tokens (in a multi-layer Transformer-XL: layers x span, since
each layer reaches one span further) can only guess n: accuracy 1 / max_count.
"""

from __future__ import annotations

import os

import numpy as np

from lm.data import IGNORE, Split, TaskData, TaskDataError, cached_task, compact_dtype

GENERATOR_VERSION = 1  # bump when the generated data changes, so caches are rebuilt
VOCAB = ["A", "B", "=", "."]
A, B, QUERY, STOP = range(len(VOCAB))


def generate_copy(
    num_episodes: int, distance: int, max_count: int, rng: np.random.Generator
) -> Split:
    """`num_episodes` episodes back to back as one stream."""
    counts = rng.integers(1, max_count + 1, size=num_episodes)
    # each episode is five runs: A's, B's, the query, the answer A's, the stop token
    run_tokens = np.tile([A, B, QUERY, A, STOP], num_episodes)
    run_lengths = np.stack(
        [
            counts,
            np.full_like(counts, distance),
            np.ones_like(counts),
            counts,
            np.ones_like(counts),
        ],
        axis=1,
    ).ravel()
    tokens = np.repeat(run_tokens, run_lengths).astype(compact_dtype(len(VOCAB)))
    run_kind = np.repeat(np.tile(np.arange(5), num_episodes), run_lengths)
    episode = np.repeat(np.arange(num_episodes, dtype=np.int32), run_lengths.reshape(-1, 5).sum(1))
    # the answer's targets are read from the query token and the answer A's
    answering = (run_kind == 2) | (run_kind == 3)
    targets = np.where(answering, np.append(tokens[1:], STOP), IGNORE).astype(tokens.dtype)
    answer_id = np.where(answering, episode, IGNORE).astype(np.int32)
    return Split(tokens, targets, answer_id)


def load_copy(
    distance: int = 64,
    max_count: int = 4,
    train_episodes: int = 20_000,
    valid_episodes: int = 1_000,
    test_episodes: int = 1_000,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> TaskData:
    """The copy task; the default distance learns in minutes on a CPU, the paper's reaches 128k."""
    if distance < 1:
        raise TaskDataError(f"distance must be at least 1, got {distance}")
    if max_count < 1:
        raise TaskDataError(f"max_count must be at least 1, got {max_count}")
    episodes = {"train": train_episodes, "valid": valid_episodes, "test": test_episodes}
    for split, count in episodes.items():
        if count < 1:
            raise TaskDataError(f"{split}_episodes must be at least 1, got {count}")
    params = {
        "version": GENERATOR_VERSION,
        "distance": distance,
        "max_count": max_count,
        "episodes": episodes,
        "seed": seed,
    }

    def build() -> TaskData:
        splits = {
            split: generate_copy(count, distance, max_count, np.random.default_rng([seed, index]))
            for index, (split, count) in enumerate(episodes.items())
        }
        info = params | {"chance_accuracy": 1 / max_count}
        return TaskData("copy", list(VOCAB), metric="accuracy", info=info, **splits)

    return cached_task("copy", params, build, cache_dir)
