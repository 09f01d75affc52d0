"""Object Collision (paper 5.3, A.3.3): where did the last collision of two colours happen?

Two particles move on a G x G grid (G = 16). A particle starts at a uniform position in
[0, G-1]^2 with a velocity drawn from N(0, speed^2 I); each step adds the velocity, unless the
new position would leave the open square (0, G-1)^2, in which case the velocity is redrawn
until it does not. A particle's cell is its position rounded to the nearest integer, so cells
are 0..G-1 on each axis. Each step each particle switches, with probability
`color_change_prob`, to one of the other colours (so its colour changes at exactly that rate).

A collision is a step at which the two particles occupy the same cell and did not at the
step before: a contact lasting several steps is one collision (counting every step would make
"the last 3 collisions" often one contact three times). Its quadrant is
2 * (y >= G // 2) + (x >= G // 2) of the shared cell, and its colour pair is ordered
(colour of particle a, colour of particle b), the colours at that step.

Every step is one frame of tokens, and questions refer to collisions up to and including
that step:
- hard (default): `x_a y_a x_b y_b colour_a colour_b ask_a ask_b`. The question (ask_a, ask_b)
  is the ordered colour pair of the last collision with probability
  `last_collision_question_prob` (0.4) and otherwise one of the other pairs, uniformly. The
  answer, the quadrant of the last collision of the asked pair, is the target at the last
  token. A pair that has not collided yet has no answer (nothing is scored that step).
- easy (`hard=False`, no colours): `x_a y_a x_b y_b ask wait...` with `num_recent - 1` wait
  tokens. `ask` is "?last" (the quadrant of the last collision, target at the ask token) or,
  with probability `recent_question_prob`, "?recent": the quadrants of the last `num_recent`
  collisions, most recent first, as targets at the ask and wait tokens (one answer span,
  right only if all are right). Scored once that many collisions have happened.
All other targets are ignored. The metric is the error rate over answers.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lm.data import IGNORE, Split, TaskData, TaskDataError, cached_task, compact_dtype

GENERATOR_VERSION = 3  # bump when the generated data or its info changes, so caches are rebuilt
COLOUR_NAMES = ("red", "green", "blue", "yellow", "purple", "orange", "cyan", "pink")
NUM_QUADRANTS = 4


@dataclass(frozen=True)
class CollisionRules:
    """Everything that defines the task besides the number of steps and the seed."""

    hard: bool = True
    grid_size: int = 16
    num_colors: int = 5
    speed: float = 0.5
    color_change_prob: float = 0.05
    last_collision_question_prob: float = 0.4  # hard: questions naming the last collision
    recent_question_prob: float = 0.5  # easy: questions asking the last num_recent collisions
    num_recent: int = 3

    def __post_init__(self) -> None:
        if self.grid_size < 2:
            raise TaskDataError(f"grid_size must be at least 2, got {self.grid_size}")
        if not 2 <= self.num_colors <= len(COLOUR_NAMES):
            raise TaskDataError(
                f"num_colors must be in 2..{len(COLOUR_NAMES)}, got {self.num_colors}"
            )
        if self.speed <= 0:
            raise TaskDataError(f"speed must be positive, got {self.speed}")
        if self.num_recent < 1:
            raise TaskDataError(f"num_recent must be at least 1, got {self.num_recent}")
        for name in ("color_change_prob", "last_collision_question_prob", "recent_question_prob"):
            if not 0 <= getattr(self, name) <= 1:
                raise TaskDataError(f"{name} must be a probability, got {getattr(self, name)}")

    @property
    def colours(self) -> tuple[str, ...]:
        return COLOUR_NAMES[: self.num_colors]

    @property
    def answers_per_step(self) -> int:
        """Answer slots at the end of each frame."""
        return 1 if self.hard else self.num_recent

    @property
    def tokens_per_step(self) -> int:
        return 8 if self.hard else 4 + self.num_recent

    @property
    def vocab(self) -> list[str]:
        cells = [f"x{i}" for i in range(self.grid_size)] + [f"y{i}" for i in range(self.grid_size)]
        if self.hard:
            questions = list(self.colours) + [f"?{c}" for c in self.colours]
        else:
            questions = ["?last", "?recent", "wait"]
        return cells + questions + [f"quadrant{q}" for q in range(NUM_QUADRANTS)]


@dataclass(frozen=True)
class CollisionWorld:
    """A simulated sequence and its questions; arrays are indexed by step first."""

    positions: np.ndarray  # (T, 2, 2) float: particle, (x, y)
    cells: np.ndarray  # (T, 2, 2) int: rounded positions
    colours: np.ndarray | None  # (T, 2) int colour index per particle (hard only)
    collision_steps: np.ndarray  # steps at which a collision happens, increasing
    questions: np.ndarray  # (T,) hard: asked pair a * num_colors + b; easy: 0 last, 1 recent
    answers: np.ndarray  # (T, answers_per_step) quadrant or IGNORE


def simulate_motion(
    num_steps: int, grid_size: int, speed: float, rng: np.random.Generator
) -> np.ndarray:
    """One particle's positions, shape (num_steps, 2), moving in straight segments.

    Each step adds the velocity unless that would leave (0, G-1)^2; then the velocity is
    redrawn until the step stays inside. Between redraws the path is the line p + k v, filled
    one segment at a time, so the Python loop runs once per bounce, not once per step.
    """
    upper = grid_size - 1
    positions = np.empty((num_steps, 2))
    x, y = rng.uniform(0, upper, size=2)
    vx, vy = rng.normal(0, speed, size=2)
    positions[0] = x, y
    step = 1
    while step < num_steps:
        while not (0 < x + vx < upper and 0 < y + vy < upper):
            vx, vy = rng.normal(0, speed, size=2)
        remaining = num_steps - step
        length = min(_steps_inside(x, vx, upper, remaining), _steps_inside(y, vy, upper, remaining))
        k = np.arange(1, length + 1)
        positions[step : step + length, 0] = x + k * vx
        positions[step : step + length, 1] = y + k * vy
        x, y = x + length * vx, y + length * vy
        step += length
    return positions


def _steps_inside(p: float, v: float, upper: float, limit: int) -> int:
    """How many steps k = 1..limit keep p + k v inside (0, upper), given that k = 1 does."""
    if v == 0:
        return limit
    wall = upper if v > 0 else 0.0
    k = max(int(min((wall - p) / v, limit)), 1)  # the float tests below settle the rounding
    while k < limit and 0 < p + (k + 1) * v < upper:
        k += 1
    while not 0 < p + k * v < upper:
        k -= 1
    return k


def simulate_colours(
    num_steps: int, num_colors: int, change_prob: float, rng: np.random.Generator
) -> np.ndarray:
    """Colours of the two particles, shape (num_steps, 2); a change always picks a new colour."""
    start = rng.integers(num_colors, size=2)
    changes = rng.random((num_steps, 2)) < change_prob
    changes[0] = False
    shifts = np.where(changes, rng.integers(1, num_colors, size=(num_steps, 2)), 0)
    return (start + np.cumsum(shifts, axis=0)) % num_colors


def quadrant(cells: np.ndarray, grid_size: int) -> np.ndarray:
    """Quadrant 2 * (y >= G // 2) + (x >= G // 2) of cells given as (..., 2) arrays of (x, y)."""
    upper_half = cells >= grid_size // 2
    return 2 * upper_half[..., 1] + upper_half[..., 0]


def simulate(num_steps: int, rules: CollisionRules, seed: int | list[int]) -> CollisionWorld:
    """Simulate `num_steps` steps and draw a question for each, from `seed` alone."""
    motion_a, motion_b, colour_rng, question_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(4)
    )
    positions = np.stack(
        [
            simulate_motion(num_steps, rules.grid_size, rules.speed, rng)
            for rng in (motion_a, motion_b)
        ],
        axis=1,
    )
    cells = np.rint(positions).astype(np.int64)
    together = (cells[:, 0] == cells[:, 1]).all(axis=1)
    collision_steps = np.flatnonzero(together & ~np.concatenate([[False], together[:-1]]))
    # index into collision_steps of the last collision at or before each step (-1: none yet)
    last = np.searchsorted(collision_steps, np.arange(num_steps), side="right") - 1
    quadrants = quadrant(cells[collision_steps, 0], rules.grid_size)
    if rules.hard:
        colours = simulate_colours(num_steps, rules.num_colors, rules.color_change_prob, colour_rng)
        pairs = colours[collision_steps, 0] * rules.num_colors + colours[collision_steps, 1]
        questions, answers = _pair_questions(last, pairs, quadrants, rules, question_rng)
    else:
        colours = None
        questions, answers = _recent_questions(last, quadrants, rules, question_rng)
    return CollisionWorld(positions, cells, colours, collision_steps, questions, answers)


def _pair_questions(
    last: np.ndarray,
    pairs: np.ndarray,
    quadrants: np.ndarray,
    rules: CollisionRules,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Hard version: an ordered colour pair per step and the quadrant of its last collision."""
    num_pairs = rules.num_colors**2
    seen = last >= 0
    last_pair = np.full(last.size, num_pairs)  # num_pairs: no collision yet
    last_pair[seen] = pairs[last[seen]]
    ask_last = seen & (rng.random(last.size) < rules.last_collision_question_prob)
    # uniform over the pairs other than the last collision's (all pairs before any collision)
    other = rng.integers(np.where(seen, num_pairs - 1, num_pairs))
    other += other >= last_pair
    questions = np.where(ask_last, last_pair, other)
    answers = np.full((last.size, 1), IGNORE)
    collision_index = np.arange(pairs.size)
    for pair in range(num_pairs):
        asked = np.flatnonzero(questions == pair)
        # the latest collision of this pair among the first last[t] + 1 collisions
        of_pair = collision_index[pairs == pair]
        latest = np.searchsorted(of_pair, last[asked], side="right") - 1
        known = latest >= 0
        answers[asked[known], 0] = quadrants[of_pair[latest[known]]]
    return questions, answers


def _recent_questions(
    last: np.ndarray, quadrants: np.ndarray, rules: CollisionRules, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Easy version: "?last" (0) or "?recent" (1) and the quadrants they ask, latest first."""
    questions = (rng.random(last.size) < rules.recent_question_prob).astype(np.int64)
    answers = np.full((last.size, rules.num_recent), IGNORE)
    asks_last = (questions == 0) & (last >= 0)
    answers[asks_last, 0] = quadrants[last[asks_last]]
    asks_recent = np.flatnonzero((questions == 1) & (last >= rules.num_recent - 1))
    for rank in range(rules.num_recent):
        answers[asks_recent, rank] = quadrants[last[asks_recent] - rank]
    return questions, answers


def baseline_errors(world: CollisionWorld, rules: CollisionRules) -> dict[str, float]:
    """Errors of answers that learn nothing, over a world's scored questions (an answer is right
    only if all its slots are): the best constant quadrant (chosen on these very answers, so no
    constant does better) and the quadrant of the last collision of any colours in every slot.
    A model beats the constant answer only by remembering collisions; the last collision is
    right whenever the question asks for it (hard: names its pair, 40%; easy: "?last") and by
    chance otherwise."""
    scored = world.answers != IGNORE
    steps = np.flatnonzero(scored.any(axis=1))
    answers, scored = world.answers[steps], scored[steps]

    def wrong(guess: np.ndarray | int) -> np.ndarray:
        return ((answers != guess) & scored).any(axis=1)

    right = max(int((~wrong(q)).sum()) for q in range(NUM_QUADRANTS))
    last = np.searchsorted(world.collision_steps, steps, side="right") - 1
    last_quadrant = quadrant(world.cells[world.collision_steps[last], 0], rules.grid_size)
    return {
        "constant_error": 1.0 - right / steps.size,
        "last_collision_error": float(wrong(last_quadrant[:, None]).mean()),
    }


def encode(world: CollisionWorld, rules: CollisionRules) -> Split:
    """The token stream of a simulation: one frame per step, answers in the last slots."""
    grid, colours = rules.grid_size, rules.num_colors
    vocab_size = len(rules.vocab)
    question_base = 2 * grid + (colours if rules.hard else 0)
    first_quadrant = vocab_size - NUM_QUADRANTS
    cells = world.cells
    position_tokens = [cells[:, 0, 0], grid + cells[:, 0, 1], cells[:, 1, 0], grid + cells[:, 1, 1]]
    if rules.hard:
        asked = [world.questions // colours, world.questions % colours]
        other_tokens = [2 * grid + world.colours[:, 0], 2 * grid + world.colours[:, 1]]
        other_tokens += [question_base + a for a in asked]
    else:
        wait = np.full_like(world.questions, question_base + 2)
        other_tokens = [question_base + world.questions] + [wait] * (rules.num_recent - 1)
    dtype = compact_dtype(vocab_size)
    inputs = np.stack(position_tokens + other_tokens, axis=1).astype(dtype)
    slots = rules.answers_per_step
    scored = world.answers != IGNORE
    targets = np.full(inputs.shape, IGNORE, dtype=dtype)
    targets[:, -slots:] = np.where(scored, first_quadrant + world.answers, IGNORE)
    # one answer span per step with an answer; all its slots are scored together
    has_answer = scored.any(axis=1)
    span_id = np.cumsum(has_answer) - 1
    answer_id = np.full(inputs.shape, IGNORE, dtype=np.int32)
    answer_id[:, -slots:] = np.where(scored, span_id[:, None], IGNORE)
    return Split(inputs.ravel(), targets.ravel(), answer_id.ravel())


SPLITS = ("train", "valid", "test")


def split_seed(seed: int, split: str) -> list[int]:
    """The simulation seed of one split of the task generated from `seed`."""
    return [seed, SPLITS.index(split)]


def split_world(options: dict[str, Any], split: str) -> tuple[CollisionWorld, CollisionRules]:
    """The simulated world behind a split of `load_collision(**options)`, for analyses that need
    more than its tokens (which question, how far back its answer lies)."""
    rules_fields = {name: options[name] for name in CollisionRules.__dataclass_fields__}
    rules = CollisionRules(**rules_fields)
    return simulate(options[f"{split}_steps"], rules, split_seed(options["seed"], split)), rules


def load_collision(
    hard: bool = True,
    train_steps: int = 1_000_000,
    valid_steps: int = 100_000,
    test_steps: int = 100_000,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    grid_size: int = 16,
    num_colors: int = 5,
    speed: float = 0.5,
    color_change_prob: float = 0.05,
    last_collision_question_prob: float = 0.4,
    recent_question_prob: float = 0.5,
    num_recent: int = 3,
) -> TaskData:
    """The collision task; the paper generates 50M/5M/5M steps (use train_steps etc.)."""
    rules = CollisionRules(
        hard=hard,
        grid_size=grid_size,
        num_colors=num_colors,
        speed=speed,
        color_change_prob=color_change_prob,
        last_collision_question_prob=last_collision_question_prob,
        recent_question_prob=recent_question_prob,
        num_recent=num_recent,
    )
    steps = {"train": train_steps, "valid": valid_steps, "test": test_steps}
    for split, count in steps.items():
        if count < 1:
            raise TaskDataError(f"{split}_steps must be at least 1, got {count}")
    params = {"version": GENERATOR_VERSION, "rules": asdict(rules), "steps": steps, "seed": seed}

    def build() -> TaskData:
        splits, baselines, collisions = {}, {}, 0
        for split, count in steps.items():
            world = simulate(count, rules, split_seed(seed, split))
            splits[split] = encode(world, rules)
            if world.collision_steps.size:
                baselines[split] = baseline_errors(world, rules)
            collisions += world.collision_steps.size
        info = params | {
            "tokens_per_step": rules.tokens_per_step,
            "collisions_per_1000_steps": 1000 * collisions / sum(steps.values()),
            "baselines": baselines,
        }
        return TaskData("collision", rules.vocab, metric="error", info=info, **splits)

    return cached_task("collision", params, build, cache_dir)
