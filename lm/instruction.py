"""Instruction task (paper 5.2, A.3.2): carry messages across a text world full of chatter.

A LIGHT-style story, generated procedurally one word token at a time. The narrator ("you")
walks between locations; at each, a line says who is present, then the characters there talk
(distractor lines). Now and then a character Y gives an instruction

    the Y says " can you tell the X that the Y wants to see them ? "

for a character X who is elsewhere. X then stays away until about `mean_distance` tokens
have passed (uniform in [mean/2, 3 mean/2]); the narrator next goes where X lives, and right
after the line saying X is present, the story executes the instruction:

    you tell the X " Y wants to see you ! "

Up to `max_pending` instructions can wait at once; several due at one place are executed in
the order they were given. The model is trained as a language model (every next token is a
target, as in the paper) and scored on execution: each execution line without its newline
is one answer span, right only if every token is. Whether an instruction is due, to whom and
from whom is only known from the instruction, hundreds of distractor tokens back.

Distractor lines come from a small grammar, or from `distractor_file` (one utterance per
line, e.g. real dialogue), tokenised in the same way: lower case, words and punctuation
marks as tokens. The vocabulary holds every word the generator uses plus the file's most
frequent words up to `max_vocab`; rarer file words become `<unk>`.
"""

from __future__ import annotations

import collections
import hashlib
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lm.data import (
    IGNORE,
    DataNotFoundError,
    Split,
    TaskData,
    TaskDataError,
    cached_task,
    compact_dtype,
    next_token_split,
)

GENERATOR_VERSION = 1  # bump when the generated data changes, so caches are rebuilt
UNK, NEWLINE = "<unk>", "\n"

CHARACTERS = (
    "butler", "town official", "knight", "blacksmith", "merchant", "guard", "baker", "farmer",
    "queen", "king", "jester", "monk", "servant", "innkeeper", "hunter", "wizard", "thief",
    "fisherman", "shepherd", "squire", "maid", "cook", "bard", "healer", "soldier", "scribe",
    "witch", "priest", "carpenter", "stable boy", "princess", "beggar",
)  # fmt: skip
LOCATIONS = (
    "tavern", "castle courtyard", "market square", "chapel", "forest clearing", "stables",
    "kitchen", "throne room", "dungeon", "village well", "docks", "library", "garden", "mill",
    "barracks", "bakery",
)  # fmt: skip
OBJECTS = (
    "sword", "bread", "lantern", "horse", "ring", "letter", "cloak", "barrel", "ale", "coin",
    "map", "shield", "key", "candle", "apple", "scroll", "rope", "axe", "crown", "boots",
    "goblet", "basket", "hammer", "book", "necklace",
)  # fmt: skip
ADJECTIVES = (
    "cold", "quiet", "busy", "dark", "old", "strange", "heavy", "golden", "broken", "lovely",
    "dusty", "famous", "cursed", "warm", "small",
)  # fmt: skip
TIMES = ("dawn", "noon", "nightfall", "the feast", "the harvest", "the storm")
VERBS = ("find", "sell", "mend", "hide", "carry", "clean", "guard", "bless")
PAST_VERBS = ("found", "sold", "mended", "hid", "carried", "cleaned", "stole", "blessed")
UTTERANCES = (
    "i have not seen the {object} since {time} .",
    "the {location} is {adjective} after {time} .",
    "do you know where my {object} is ?",
    "after {time} the {character} {past_verb} the {object} .",
    "we should {verb} the {object} before {time} .",
    "have you heard about the {adjective} {object} in the {location} ?",
    "i need the {adjective} {object} for the {character} .",
    "the {character} told me the {object} was {adjective} .",
    "bring me the {object} and i will pay you well .",
    "it is the right day to {verb} the {object} .",
    "why is the {character} always at the {location} ?",
    "welcome , traveller ! would you like some {object} ?",
    "i heard the {character} wants the {object} back .",
    "nobody goes to the {location} after {time} .",
)
ACTIONS = (
    "the {speaker} picks up the {object} .",
    "the {speaker} looks at you and smiles .",
    "the {speaker} puts the {object} on the table .",
    "you look at the {adjective} {object} .",
    "the {speaker} sighs .",
)
SLOTS = {
    "object": OBJECTS,
    "adjective": ADJECTIVES,
    "time": TIMES,
    "verb": VERBS,
    "past_verb": PAST_VERBS,
    "character": CHARACTERS,
    "location": LOCATIONS,
}
FIXED_LINES = (
    "you go to the .",
    "here is the .",
    "here are the , the and the .",
    'the says " can you tell the that the wants to see them ? "',
    'you tell the " wants to see you ! "',
)
SLOT_SIZES = [len(words) for words in SLOTS.values()]
ACTION_PROB = 0.2  # share of distractor lines that are actions rather than speech
SCENE_LINES = (2, 12)  # distractor lines per visit, uniform
PRESENCE_PROB = 0.6  # chance that a resident who may be seen is at home
# tokens a move and a presence line take, plus half a distractor line: the lead with which
# an instruction is considered due, so executions land on average at the drawn distance
ARRIVAL_LEAD = 25
MAX_UTTERANCE_TOKENS = 60  # longer lines of a distractor file are cut


def tokenize(text: str) -> list[str]:
    """Lower-cased words (with inner apostrophes) and single punctuation marks."""
    return re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*|[^\sa-z0-9]", text.lower())


@dataclass(frozen=True)
class WorldRules:
    mean_distance: int = 950
    num_characters: int = 24
    num_locations: int = 12
    instruction_prob: float = 0.05  # per distractor line
    max_pending: int = 4

    def __post_init__(self) -> None:
        if self.mean_distance < 2:
            raise TaskDataError(f"mean_distance must be at least 2, got {self.mean_distance}")
        if not 2 <= self.num_locations <= len(LOCATIONS):
            raise TaskDataError(f"num_locations must be in 2..{len(LOCATIONS)}")
        if (
            not max(self.num_locations, self.max_pending + 1)
            <= self.num_characters
            <= len(CHARACTERS)
        ):
            raise TaskDataError(
                f"num_characters must be at least num_locations (every place has a resident) "
                f"and above max_pending, and at most {len(CHARACTERS)}; got {self.num_characters}"
            )
        if not 0 < self.instruction_prob <= 1:
            raise TaskDataError(f"instruction_prob must be in (0, 1], got {self.instruction_prob}")
        if self.max_pending < 1:
            raise TaskDataError(f"max_pending must be at least 1, got {self.max_pending}")


@dataclass
class Instruction:
    """One message to deliver; token indices refer to the story's token list."""

    receiver: str
    sender: str
    given_end: int  # index just after the instruction line
    due: int  # the story goes to the receiver once it reaches this index
    executed: tuple[int, int] | None = None  # [start, stop) of the execution, newline excluded


@dataclass
class Story:
    tokens: list[str] = field(default_factory=list)
    instructions: list[Instruction] = field(default_factory=list)


class StoryWriter:
    """Writes a story scene by scene: move, presence, due executions, distractor lines."""

    def __init__(
        self,
        rules: WorldRules,
        homes: dict[str, str],
        rng: np.random.Generator,
        utterances: list[list[str]] | None = None,
    ):
        self.rules, self.homes, self.rng, self.utterances = rules, homes, rng, utterances
        self.characters = list(homes)
        self.locations = sorted(set(homes.values()))
        self.story = Story()
        self.pending: list[Instruction] = []
        self.location: str | None = None
        self.present: list[str] = []

    def write(self, num_tokens: int) -> Story:
        """Scenes until the story has at least `num_tokens` tokens."""
        while len(self.story.tokens) < num_tokens:
            self._scene()
        return self.story

    def _scene(self) -> None:
        due = self._due()
        if due is None:
            self._arrive(self._pick([loc for loc in self.locations if loc != self.location]))
        else:
            if self.homes[due.receiver] == self.location:
                self._arrive(self._pick([loc for loc in self.locations if loc != self.location]))
            self._arrive(self.homes[due.receiver])
        for _ in range(self.rng.integers(SCENE_LINES[0], SCENE_LINES[1] + 1)):
            if self._due() is not None:
                return
            self._distractor_or_instruction()

    def _due(self) -> Instruction | None:
        """Of the instructions due by the time the story could reach them, the earliest."""
        return min(filter(self._is_due, self.pending), key=lambda i: i.due, default=None)

    def _is_due(self, instruction: Instruction) -> bool:
        return instruction.due <= len(self.story.tokens) + ARRIVAL_LEAD

    def _arrive(self, location: str) -> None:
        self.location = location
        self._line(f"you go to the {location} .")
        waiting = {i.receiver for i in self.pending}
        due = {i.receiver for i in filter(self._is_due, self.pending)}
        residents = [c for c in self.characters if self.homes[c] == location]
        free = [c for c in residents if c not in waiting]
        present = [
            c for c in residents if c in due or (c in free and self.rng.random() < PRESENCE_PROB)
        ]
        if not present:  # someone is always there to talk; residents can all be away
            present = [self._pick(free or [c for c in self.characters if c not in waiting])]
        self.present = present
        names = [f"the {c}" for c in present]
        listed = names[0] if len(names) == 1 else f"{' , '.join(names[:-1])} and {names[-1]}"
        self._line(f"here {'is' if len(names) == 1 else 'are'} {listed} .")
        for instruction in [i for i in self.pending if i.receiver in present]:
            start = len(self.story.tokens)
            self._line(
                f'you tell the {instruction.receiver} " {instruction.sender} wants to see you ! "'
            )
            instruction.executed = (start, len(self.story.tokens) - 1)
            self.pending.remove(instruction)

    def _distractor_or_instruction(self) -> None:
        speaker = self._pick(self.present)
        busy = set(self.present) | {i.receiver for i in self.pending}
        receivers = [c for c in self.characters if c not in busy]
        wants = self.rng.random() < self.rules.instruction_prob
        if wants and len(self.pending) < self.rules.max_pending and receivers:
            receiver = self._pick(receivers)
            self._line(
                f'the {speaker} says " can you tell the {receiver} that the {speaker} '
                'wants to see them ? "'
            )
            given_end = len(self.story.tokens)
            mean = self.rules.mean_distance
            delay = int(self.rng.integers(mean // 2, mean + mean // 2 + 1))
            instruction = Instruction(receiver, speaker, given_end, given_end + delay)
            self.pending.append(instruction)
            self.story.instructions.append(instruction)
        elif self.rng.random() < ACTION_PROB:
            self._line(self._fill(self._pick(ACTIONS), speaker))
        elif self.utterances is not None:
            self._say(speaker, self.utterances[self.rng.integers(len(self.utterances))])
        else:
            self._say(speaker, tokenize(self._fill(self._pick(UTTERANCES), speaker)))

    def _fill(self, template: str, speaker: str) -> str:
        picks = self.rng.integers(SLOT_SIZES)
        words = {slot: SLOTS[slot][i] for slot, i in zip(SLOTS, picks, strict=True)}
        return template.format(speaker=speaker, **words)

    def _line(self, text: str) -> None:
        self.story.tokens += tokenize(text) + [NEWLINE]

    def _say(self, speaker: str, words: list[str]) -> None:
        self.story.tokens += ["the", *speaker.split(), "says", '"', *words, '"', NEWLINE]

    def _pick(self, choices: Sequence[str]) -> str:
        return choices[self.rng.integers(len(choices))]


def make_world(rules: WorldRules, rng: np.random.Generator) -> dict[str, str]:
    """Character -> home location; every location has at least one resident."""
    characters = [CHARACTERS[i] for i in rng.permutation(len(CHARACTERS))[: rules.num_characters]]
    locations = [LOCATIONS[i] for i in rng.permutation(len(LOCATIONS))[: rules.num_locations]]
    # one resident for each location first, then the others anywhere
    homes = dict(zip(characters[: len(locations)], locations, strict=True))
    for character in characters[rules.num_locations :]:
        homes[character] = locations[rng.integers(len(locations))]
    return homes


def generator_words() -> set[str]:
    """Every token the generator itself can write."""
    templates = [re.sub(r"\{\w+\}", " ", text) for text in (*UTTERANCES, *ACTIONS)]
    texts = [*FIXED_LINES, *templates, *(word for words in SLOTS.values() for word in words)]
    return {token for text in texts for token in tokenize(text)}


def read_utterances(path: str | os.PathLike) -> list[list[str]]:
    """Non-empty lines of a text file, tokenised and cut to MAX_UTTERANCE_TOKENS."""
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        raise DataNotFoundError(
            f"distractor_file {path} does not exist; give a text file with one utterance per line"
        )
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    utterances = [tokens[:MAX_UTTERANCE_TOKENS] for tokens in map(tokenize, lines) if tokens]
    if not utterances:
        raise TaskDataError(f"distractor_file {path} holds no words; give lines of dialogue")
    return utterances


def build_vocab(utterances: list[list[str]] | None, max_vocab: int) -> list[str]:
    """<unk>, newline, the generator's words, then the file's most frequent words."""
    fixed = sorted(generator_words())
    vocab = [UNK, NEWLINE, *fixed]
    if utterances is not None:
        known = set(vocab)
        counts = collections.Counter(t for u in utterances for t in u if t not in known)
        ranked = sorted(counts, key=lambda word: (-counts[word], word))
        vocab += ranked[: max(0, max_vocab - len(vocab))]
    return vocab


def encode_story(story: Story, vocab: list[str]) -> Split:
    """The story as a next-token split, each execution line one answer span."""
    index = {word: i for i, word in enumerate(vocab)}
    unk = index[UNK]
    ids = np.array([index.get(t, unk) for t in story.tokens], dtype=compact_dtype(len(vocab)))
    split = next_token_split(ids)
    answer_id = np.full(len(split), IGNORE, dtype=np.int32)
    executed = [i.executed for i in story.instructions if i.executed is not None]
    for span_id, (start, stop) in enumerate(sorted(executed)):
        answer_id[start - 1 : stop - 1] = span_id  # position t predicts token t + 1
    return Split(split.inputs, split.targets, answer_id)


SPLITS = ("train", "valid", "test")


def split_seed(seed: int, split: str | None) -> list[int]:
    """The generator seed of one split of the task made from `seed`; None: of its world."""
    return [seed, 0 if split is None else 1 + SPLITS.index(split)]


def split_story(options: dict[str, Any], split: str) -> Story:
    """The story behind a split of `load_instruction(**options)`, for analyses that need more
    than its tokens (which instruction an execution carries out, and how far back it was)."""
    rules = WorldRules(**{name: options[name] for name in WorldRules.__dataclass_fields__})
    seed, file = options["seed"], options["distractor_file"]
    utterances = None if file is None else read_utterances(file)
    homes = make_world(rules, np.random.default_rng(split_seed(seed, None)))
    rng = np.random.default_rng(split_seed(seed, split))
    return StoryWriter(rules, homes, rng, utterances).write(options[f"{split}_tokens"])


def load_instruction(
    mean_distance: int = 950,
    train_tokens: int = 2_000_000,
    valid_tokens: int = 200_000,
    test_tokens: int = 200_000,
    num_characters: int = 24,
    num_locations: int = 12,
    instruction_prob: float = 0.05,
    max_pending: int = 4,
    distractor_file: str | os.PathLike | None = None,
    max_vocab: int = 10_000,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
) -> TaskData:
    """The instruction task, scored on execution accuracy."""
    rules = WorldRules(mean_distance, num_characters, num_locations, instruction_prob, max_pending)
    sizes = {"train": train_tokens, "valid": valid_tokens, "test": test_tokens}
    for split, count in sizes.items():
        if count < 1:
            raise TaskDataError(f"{split}_tokens must be at least 1, got {count}")
    utterances = None if distractor_file is None else read_utterances(distractor_file)
    params = {
        "version": GENERATOR_VERSION,
        "rules": asdict(rules),
        "tokens": sizes,
        "max_vocab": max_vocab,
        "seed": seed,
        "distractors": None if utterances is None else _fingerprint(utterances),
    }

    def build() -> TaskData:
        homes = make_world(rules, np.random.default_rng(split_seed(seed, None)))
        vocab = build_vocab(utterances, max_vocab)
        splits, distances = {}, []
        for split, count in sizes.items():
            rng = np.random.default_rng(split_seed(seed, split))
            story = StoryWriter(rules, homes, rng, utterances).write(count)
            splits[split] = encode_story(story, vocab)
            distances += [i.executed[0] - i.given_end for i in story.instructions if i.executed]
        info = params | {
            "homes": homes,
            "measured_mean_distance": float(np.mean(distances)) if distances else None,
        }
        return TaskData("instruction", vocab, metric="accuracy", info=info, **splits)

    return cached_task("instruction", params, build, cache_dir)


def _fingerprint(utterances: list[list[str]]) -> str:
    text = "\n".join(" ".join(u) for u in utterances)
    return hashlib.sha256(text.encode()).hexdigest()
