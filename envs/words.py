"""The MazeBase observation: the words of the cells in a small window around the agent.

Every kind of cell describes itself with a few words ("block"; "door", "red"; ...). A map is
stored as a flat array of cell codes whose rows are `row_stride` apart, padded so that a window
around any cell the agent can stand on stays inside the array. The window is read for a whole
batch of agents at once with one gather and one table look-up.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gymnasium import spaces


class WordWindow:
    """Multi-hot word vectors of the `size` x `size` cells centred on the agent.

    `observe` writes `out[n, row, col, word]`, row 0 the northern row and col 0 the western
    column, so the agent sits at `out[n, size // 2, size // 2]`, which also carries `agent`.
    """

    def __init__(
        self,
        vocab: Sequence[str],
        cell_words: Sequence[Sequence[str]],
        row_stride: int,
        size: int = 3,
    ) -> None:
        """`cell_words[code]` lists the words of a cell with that code (none for empty floor)."""
        if size < 1 or size % 2 == 0:
            raise ValueError(f"window size must be odd and positive, got {size}")
        if len(set(vocab)) != len(vocab):
            raise ValueError(f"vocabulary words must be distinct, got {list(vocab)}")
        self.vocab = list(vocab)
        self.size = size
        word_index = {word: i for i, word in enumerate(self.vocab)}
        unknown = {word for words in cell_words for word in words} - word_index.keys()
        if unknown:
            raise ValueError(f"cell words {sorted(unknown)} are not in the vocabulary {vocab}")
        self.table = np.zeros((len(cell_words), len(self.vocab)), dtype=np.uint8)
        for code, words in enumerate(cell_words):
            self.table[code, [word_index[word] for word in words]] = 1
        self.agent_word = word_index["agent"]
        radius = size // 2
        rows, cols = np.mgrid[-radius : radius + 1, -radius : radius + 1]
        self.offsets = (rows * row_stride + cols).reshape(-1)  # row-major: north-west first
        self.observation_space = spaces.Box(0, 1, (size, size, len(self.vocab)), np.uint8)

    def word_index(self, word: str) -> int:
        return self.vocab.index(word)

    def observe(self, cells: np.ndarray, centres: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write the windows around the flat cell indices `centres` into `out` (n, k, k, V)."""
        if not out.flags.c_contiguous:  # the gather below writes through a reshaped view
            raise ValueError("the observation buffer must be C-contiguous")
        # Indices laid out (window cell, n): NumPy adds along the long axis much faster.
        codes = cells[self.offsets[:, None] + centres].T
        np.take(self.table, codes, axis=0, out=out.reshape(len(centres), self.size**2, -1))
        out[:, self.size // 2, self.size // 2, self.agent_word] = 1
        return out
