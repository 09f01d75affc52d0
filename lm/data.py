"""The token-stream format every language-model task produces, its metric and its disk cache.

A task is one long token stream per split. A trainer cuts a split into B contiguous rows and
walks them in blocks of K tokens, carrying the memory from block to block, so a model can use
anything it saw earlier in its row:

    data = load_task("copy", distance=64, cache_dir="cache")
    rows = data.train.batchify(B)                                  # arrays of shape (B, N // B)
    for start in range(0, rows.inputs.shape[1], K):
        x = torch.from_numpy(rows.inputs[:, start : start + K].astype(np.int64))
        y = torch.from_numpy(rows.targets[:, start : start + K].astype(np.int64))
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)

Evaluation walks `data.valid.head(n).batchify(B)` the same way. metric "bpb": mean
cross-entropy over targets != IGNORE, divided by ln 2. "accuracy" / "error": keep the argmax
predictions in an array shaped like the rows and call `answer_accuracy(pred, rows)`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

IGNORE = -1  # a target that is neither trained on nor scored; an answer_id outside any span


class TaskDataError(ValueError):
    """Bad task options or unusable data; the message says what to change."""


class DataNotFoundError(TaskDataError, FileNotFoundError):
    """A data file the task reads is missing; the message says where it comes from."""


@dataclass(frozen=True)
class Split:
    """One split as aligned arrays: the model reads `inputs[t]` and is trained to emit `targets[t]`.

    Arrays are 1-D streams, or 2-D (rows, length) after `batchify`. Integer dtypes are kept
    small (uint8 for bytes) to save memory; convert each block with `.astype(np.int64)`.
    `targets == IGNORE` marks positions that are neither trained on nor scored. `answer_id`
    (tasks scored on answers only) gives each position the id of the answer span its target
    belongs to, or IGNORE; ids are unique within a split and increase along the stream.
    """

    inputs: np.ndarray
    targets: np.ndarray
    answer_id: np.ndarray | None = None

    def __post_init__(self) -> None:
        shapes = {self.inputs.shape, self.targets.shape}
        if self.answer_id is not None:
            shapes.add(self.answer_id.shape)
        if len(shapes) != 1:
            raise ValueError(f"inputs, targets and answer_id must have one shape, got {shapes}")

    def __len__(self) -> int:
        return self.inputs.size

    @property
    def num_answers(self) -> int:
        """Number of answer spans (0 for plain language modelling)."""
        if self.answer_id is None:
            return 0
        return len(np.unique(self.answer_id[self.answer_id != IGNORE]))

    def head(self, length: int) -> Split:
        """The first `length` positions of a 1-D split (e.g. a quicker validation)."""
        if self.inputs.ndim != 1:
            raise ValueError("head() takes a 1-D split; call it before batchify()")
        return self._prefix(length)

    def batchify(self, batch_size: int) -> Split:
        """Cut the stream into `batch_size` contiguous rows of equal length, shape (B, N // B).

        Row b continues where row b - 1 stops in the original stream, so flattening gives the
        stream back; the last N % B positions are dropped.
        """
        if self.inputs.ndim != 1:
            raise ValueError("batchify() takes a 1-D split")
        row_length = len(self) // batch_size if batch_size > 0 else 0
        if row_length < 1:
            raise TaskDataError(
                f"a split of {len(self):,} positions cannot be cut into {batch_size} rows; "
                "use a smaller batch size or more data"
            )
        prefix = self._prefix(batch_size * row_length)
        return Split(
            *(
                None if a is None else a.reshape(batch_size, row_length)
                for a in (prefix.inputs, prefix.targets, prefix.answer_id)
            )
        )

    def _prefix(self, length: int) -> Split:
        """The first `length` positions; an answer span cut in two is dropped from the metric."""
        answer_id = self.answer_id
        if answer_id is not None:
            cut_id = answer_id[length] if length < len(self) else IGNORE
            answer_id = answer_id[:length]
            if cut_id != IGNORE:
                answer_id = np.where(answer_id == cut_id, IGNORE, answer_id)
        return Split(self.inputs[:length], self.targets[:length], answer_id)


@dataclass(frozen=True)
class TaskData:
    """A task's three splits, its vocabulary and the metric it is judged on.

    metric: "bpb" (bits per byte: mean cross-entropy in bits over scored positions; the
    streams are raw bytes), "accuracy" or "error" (`answer_accuracy` / one minus it).
    """

    name: str
    vocab: list[str]  # token id -> printable string
    train: Split
    valid: Split
    test: Split
    metric: str
    info: dict[str, Any] = field(default_factory=dict)  # options and statistics, for logs

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def split(self, name: str) -> Split:
        """The split called "train", "valid" or "test"."""
        if name not in ("train", "valid", "test"):
            raise ValueError(f"unknown split {name!r}; expected 'train', 'valid' or 'test'")
        return getattr(self, name)

    def decode(self, ids: np.ndarray | list[int]) -> str:
        """Readable text for token ids: UTF-8 for byte streams, space-separated words otherwise."""
        ids = np.asarray(ids).ravel()
        if self.metric == "bpb":
            return ids.astype(np.uint8).tobytes().decode("utf-8", errors="replace")
        return " ".join(self.vocab[i] for i in ids)


def answer_accuracy(pred: np.ndarray, split: Split) -> float:
    """Fraction of answer spans whose every scored target is predicted exactly.

    `pred` holds the predicted token (argmax) at each position, same shape as the split's
    arrays. Returns NaN when the split holds no answer span.
    """
    if split.answer_id is None:
        raise ValueError("this split has no answer spans; its task is scored in bits per byte")
    pred = np.asarray(pred)
    if pred.shape != split.targets.shape:
        raise ValueError(f"pred has shape {pred.shape}, the split {split.targets.shape}")
    in_span = (split.answer_id != IGNORE) & (split.targets != IGNORE)
    spans = np.unique(split.answer_id[in_span])
    if spans.size == 0:
        return float("nan")
    wrong_spans = np.unique(split.answer_id[in_span & (pred != split.targets)])
    return (spans.size - wrong_spans.size) / spans.size


def source_rows(vocab: list[str], source_vocab: list[str]) -> np.ndarray:
    """For each token of `vocab`, the row of `source_vocab` a transferred model starts it from
    (-1: none, the row keeps its fresh initialisation).

    A token takes the row of the same name. A numbered family (numbered from 0) that grew, like
    a grid's cells x0..x3 becoming x0..x15, takes rows scaled to the source family's size: x_j
    from x_(j g / G) for g source and G new members, so each coarse cell's row covers the fine
    cells inside it and halves of the grid stay halves (a curriculum from a small grid to a
    large one).
    """
    by_name = {token: row for row, token in enumerate(source_vocab)}
    source_sizes, sizes = _family_sizes(source_vocab), _family_sizes(vocab)
    rows = np.full(len(vocab), -1)
    for index, token in enumerate(vocab):
        match = _NUMBERED.fullmatch(token)
        if match and source_sizes.get(match[1], sizes[match[1]]) != sizes[match[1]]:
            prefix, number = match[1], int(match[2])
            token = f"{prefix}{number * source_sizes[prefix] // sizes[prefix]}"
        rows[index] = by_name.get(token, -1)
    return rows


def _family_sizes(vocab: list[str]) -> Counter:
    """How many numbered tokens (x0, x1, ...) share each prefix."""
    return Counter(match[1] for token in vocab if (match := _NUMBERED.fullmatch(token)))


_NUMBERED = re.compile(r"(\D+)(\d+)")  # a numbered token: its prefix and its number


def next_token_split(tokens: np.ndarray) -> Split:
    """Plain language modelling: each position's target is the following token."""
    return Split(tokens[:-1], tokens[1:])


def compact_dtype(vocab_size: int) -> type[np.signedinteger]:
    """The smallest signed integer type holding token ids below `vocab_size` and IGNORE."""
    return np.int16 if vocab_size <= np.iinfo(np.int16).max else np.int32


# ------------------------------------------------------------------ byte-level text tasks

BYTE_VOCAB = [chr(i) for i in range(256)]  # byte value -> its Latin-1 character
ENWIK8_URL = "http://mattmahoney.net/dc/enwik8.zip"
ENWIK8_SPLIT = (90_000_000, 5_000_000, 5_000_000)  # train, valid, test bytes (standard)


def load_enwik8(data_dir: str | os.PathLike = "data") -> TaskData:
    """enwik8 (the first 10^8 bytes of English Wikipedia), split 90M/5M/5M bytes, in bits/byte.

    Reads `enwik8` or `enwik8.zip` from `data_dir`.
    """
    return _load_enwik8(data_dir, ENWIK8_SPLIT)


def _load_enwik8(data_dir: str | os.PathLike, split_sizes: tuple[int, int, int]) -> TaskData:
    directory = Path(data_dir).expanduser().resolve()
    raw, source = directory / "enwik8", directory / "enwik8.zip"
    total = sum(split_sizes)
    if raw.is_file():
        data, source = np.fromfile(raw, dtype=np.uint8, count=total), raw
    elif source.is_file():
        data = np.frombuffer(_read_enwik8_zip(source), dtype=np.uint8)[:total]
    else:
        raise DataNotFoundError(
            f"enwik8 not found: neither 'enwik8' nor 'enwik8.zip' is in {directory}. It is the "
            f"Hutter Prize data set; download {ENWIK8_URL} (on a machine with internet if need "
            "be) and put it, zipped or unzipped, in that directory, or set the task's data_dir "
            "to the directory that holds it."
        )
    if data.size < total:
        raise TaskDataError(
            f"{source} holds {data.size:,} bytes, enwik8 has {total:,}: the file looks "
            f"truncated; download {ENWIK8_URL} again"
        )
    return _byte_task("enwik8", data, split_sizes, source)


def _read_enwik8_zip(path: Path) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive:
            names = [n for n in archive.namelist() if not n.endswith("/")]
            member = "enwik8" if "enwik8" in names else (names[0] if len(names) == 1 else None)
            if member is None:
                raise TaskDataError(
                    f"{path} holds {names}, not a file named 'enwik8'; use the original "
                    f"archive from {ENWIK8_URL}"
                )
            return archive.read(member)
    except zipfile.BadZipFile as error:
        raise TaskDataError(
            f"{path} is not a readable zip file ({error}); download {ENWIK8_URL} again"
        ) from error


def load_text(
    path: str | os.PathLike, valid_fraction: float = 0.05, test_fraction: float = 0.05
) -> TaskData:
    """Any file as a byte stream: the first part trains, then come valid and test (bits/byte)."""
    if not path:
        raise TaskDataError("the text task needs a file: set task.path=/path/to/your/file")
    path = Path(path).expanduser().resolve()
    if not path.is_file():
        where = "is a directory" if path.is_dir() else "does not exist"
        raise DataNotFoundError(f"text file {path} {where}; set path to a readable file")
    for name, fraction in (("valid_fraction", valid_fraction), ("test_fraction", test_fraction)):
        if not 0 < fraction < 1:
            raise TaskDataError(f"{name} must be between 0 and 1, got {fraction}")
    if valid_fraction + test_fraction >= 1:
        raise TaskDataError(
            f"valid_fraction + test_fraction = {valid_fraction + test_fraction} leaves nothing "
            "to train on; it must be below 1"
        )
    data = np.fromfile(path, dtype=np.uint8)
    n_valid, n_test = int(len(data) * valid_fraction), int(len(data) * test_fraction)
    n_train = len(data) - n_valid - n_test
    if min(n_train, n_valid, n_test) < 2:
        raise TaskDataError(
            f"{path} has {len(data):,} bytes, too few to split into train/valid/test with "
            f"fractions {valid_fraction}/{test_fraction}: every split needs at least 2 bytes; "
            "use a bigger file"
        )
    return _byte_task("text", data, (n_train, n_valid, n_test), path)


def _byte_task(
    name: str, data: np.ndarray, split_bytes: tuple[int, int, int], source: Path
) -> TaskData:
    """Bytes cut into train, valid and test, in that order, scored in bits per byte."""
    n_train, n_valid, _ = split_bytes  # test: the rest (the callers cut data to size)
    train, valid, test = np.split(data, [n_train, n_train + n_valid])
    return TaskData(
        name=name,
        vocab=BYTE_VOCAB,
        train=next_token_split(train),
        valid=next_token_split(valid),
        test=next_token_split(test),
        metric="bpb",
        info={"source": str(source), "split_bytes": list(split_bytes)},
    )


# ------------------------------------------------------------------ generated-task cache

SPLITS = ("train", "valid", "test")


def cache_path(cache_dir: str | os.PathLike, name: str, params: dict[str, Any]) -> Path:
    """Where the task generated from `params` (every option that changes the data) is kept."""
    key = hashlib.sha256(json.dumps([name, params], sort_keys=True).encode()).hexdigest()
    return Path(cache_dir).expanduser() / f"{name}-{key[:20]}.npz"


def cached_task(
    name: str,
    params: dict[str, Any],
    build: Callable[[], TaskData],
    cache_dir: str | os.PathLike | None,
) -> TaskData:
    """`build()` once per `params` and keep the result in `cache_dir` (None: no cache)."""
    if cache_dir is None:
        return build()
    path = cache_path(cache_dir, name, params)
    if path.is_file():
        try:
            return _load_cached(path)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile):
            pass  # unreadable (e.g. written by an older format): generate it again
    data = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {
        f"{split}_{part}": array
        for split in SPLITS
        for part, array in vars(data.split(split)).items()
        if array is not None
    }
    meta = {"name": data.name, "vocab": data.vocab, "metric": data.metric, "info": data.info}
    _save_npz_atomically(path, meta=np.array(json.dumps(meta)), **arrays)
    return data


def _save_npz_atomically(path: Path, **arrays: np.ndarray) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file.

    (Not training.files.atomic_open: importing `training` loads torch, and the data side
    needs NumPy only.)
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as file:
            np.savez(file, **arrays)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _load_cached(path: Path) -> TaskData:
    with np.load(path, allow_pickle=False) as stored:
        meta = json.loads(str(stored["meta"]))
        splits = {
            split: Split(
                stored[f"{split}_inputs"],
                stored[f"{split}_targets"],
                stored[f"{split}_answer_id"] if f"{split}_answer_id" in stored else None,
            )
            for split in SPLITS
        }
    return TaskData(meta["name"], meta["vocab"], metric=meta["metric"], info=meta["info"], **splits)
