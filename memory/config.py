"""Configuration of the memory transformer core: one dataclass (Hydra's schema of
configs/memory/, registered by `training.schemas`; this package needs only PyTorch)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class MemoryConfig:
    """Hyper-parameters of :class:`memory.MemoryTransformer`.

    Defaults are the paper's Corridor agent (A.3.1): 2 layers, 64 units, L = 200, R = 16,
    alpha = 5e-6, BPTT blocks of 100 steps. Fields that a kind does not use are ignored by it.
    """

    kind: str = "expire_span"  # one of memory.kind_names() (a module of memory/ each), gru, lstm
    num_layers: int = 2
    dim: int = 64
    num_heads: int = 4
    ffn_dim: int = 256
    max_span: int = 200  # L: the longest distance a memory can be attended from
    # Distances 0..block_len-1 get relative position embeddings (A.1), so a block of this
    # many steps sees all of itself with positions. train_lm.py reads blocks of block_len
    # tokens; the RL learner's blocks are its unrolls (unroll_len), independent of it.
    block_len: int = 100
    dropout: float = 0.0  # on attention weights and on both residual branches
    ramp: float = 16.0  # R: length of the soft mask's ramp (expire_span, adaptive_span)
    aux_loss_coef: float = 5e-6  # alpha: weight of the span penalty (expire_span, adaptive_span)
    # Initial span as a fraction of L: sets the span predictor's bias (expire_span, A.1 "small
    # initial spans") and the initial learned span of every head (adaptive_span).
    init_span_fraction: float = 0.1
    scaled_span: bool = False  # expire_span: eq. 8, e = L sigmoid((w.h + b) / R), for very large L
    memory_shortening: bool = False  # expire_span: random memory shortening in training (4.2)
    # expire_span: spans held where the attention relies on a memory. A memory that a query
    # gave more than attended_threshold of its attention at age n is pulled up to
    # e_i >= (1 + attended_margin) n with weight attended_span_coef per step short, per query
    # (0: off, the paper's loss).
    attended_span_coef: float = 0.0
    attended_threshold: float = 0.5
    attended_margin: float = 0.0
    compress_rate: int = 4  # c: compressive memories pool groups of c evicted memories
    compressed_span: int | None = None  # compressive: compressed memories kept (None: max_span)
    # The hyper-parameters of a kind added in a module of its own, by name (the kind checks
    # them: MemoryKind.check_options); memory.options.NAME=VALUE on the command line.
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from memory.kind import kind_classes  # (the kinds import this module)

        kinds = kind_classes()
        if self.kind not in kinds:
            raise ValueError(f"memory kind {self.kind!r} is unknown; choose one of {list(kinds)}")
        kinds[self.kind].check_options(self.options)
        for name in ("num_layers", "dim", "num_heads", "ffn_dim", "max_span", "block_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"memory.{name} must be a positive integer, got {value!r}")
        if self.dim % self.num_heads != 0:
            suggestion = self.num_heads * max(1, self.dim // self.num_heads)
            raise ValueError(
                f"memory.dim ({self.dim}) must be divisible by memory.num_heads "
                f"({self.num_heads}); e.g. dim={suggestion}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"memory.dropout must be in [0, 1), got {self.dropout}")
        if not (math.isfinite(self.ramp) and self.ramp >= 1):
            raise ValueError(f"memory.ramp (R) must be >= 1 timestep, got {self.ramp}")
        if not (math.isfinite(self.aux_loss_coef) and self.aux_loss_coef >= 0):
            raise ValueError(f"memory.aux_loss_coef must be >= 0, got {self.aux_loss_coef}")
        if not (math.isfinite(self.attended_span_coef) and self.attended_span_coef >= 0):
            raise ValueError(
                f"memory.attended_span_coef must be >= 0 (0: off), got {self.attended_span_coef}"
            )
        if not 0.0 < self.attended_threshold < 1.0:
            raise ValueError(
                "memory.attended_threshold is a share of a query's attention and must be in "
                f"(0, 1), got {self.attended_threshold}"
            )
        if not (math.isfinite(self.attended_margin) and self.attended_margin >= 0):
            raise ValueError(
                "memory.attended_margin is a fraction of the age relied on and must be >= 0, "
                f"got {self.attended_margin}"
            )
        if not 0.0 < self.init_span_fraction < 1.0:
            raise ValueError(
                "memory.init_span_fraction is the initial span as a fraction of max_span and "
                f"must be in (0, 1), got {self.init_span_fraction}"
            )
        if self.kind == "compressive" and not 1 <= self.compress_rate <= self.max_span:
            raise ValueError(
                f"memory.compress_rate must be in [1, max_span={self.max_span}] (a group is "
                "compressed when it leaves the FIFO of max_span memories), "
                f"got {self.compress_rate}"
            )
        if self.compressed_span is not None and self.compressed_span < 1:
            raise ValueError(
                f"memory.compressed_span must be a positive integer or null, got "
                f"{self.compressed_span}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def num_compressed(self) -> int:
        """How many compressed memories a compressive layer keeps (n_cm in Rae et al. 2020)."""
        return self.max_span if self.compressed_span is None else self.compressed_span
