"""Recurrent cores (LSTM, GRU) with the memory transformer's interface: the baselines."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from memory import CoreOutput

RECURRENT_KINDS = ("lstm", "gru")


class RecurrentState(NamedTuple):
    h: torch.Tensor  # (num_layers, B, dim)
    c: torch.Tensor | None = None  # (num_layers, B, dim), the LSTM's cell; None for a GRU

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RecurrentState:
        return RecurrentState(fn(self.h), None if self.c is None else fn(self.c))

    def select(self, index) -> RecurrentState:
        """The state of the batch elements ``index`` (e.g. a minibatch of environments)."""
        return self.map(lambda x: x[:, index])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as tensors, as `memory.MemoryState.state_dict` gives it."""
        return {key: x.detach().cpu().clone() for key, x in self._asdict().items() if x is not None}

    @classmethod
    def from_state_dict(
        cls, saved: dict[str, torch.Tensor], device: torch.device | str
    ) -> RecurrentState:
        return cls(**saved).map(lambda x: x.to(device))


class RecurrentCore(nn.Module):
    """A stack of LSTM or GRU layers (``kind``) that runs in block mode and step mode like
    `memory.MemoryTransformer`, so the agent swaps one for the other unchanged.

    The state is a `RecurrentState`. An `episode_start` flag zeroes the state of that element
    before the step it marks. `memory_size` is reported as 1: the core carries one summary
    vector per layer, not a set of past hidden states.
    """

    def __init__(self, dim: int, num_layers: int = 1, kind: str = "lstm") -> None:
        super().__init__()
        if kind not in RECURRENT_KINDS:
            raise ValueError(f"kind={kind}: a recurrent core is one of {RECURRENT_KINDS}")
        self.dim = dim
        self.num_layers = num_layers
        self.kind = kind
        rnn = (nn.LSTM if kind == "lstm" else nn.GRU)(dim, dim, num_layers, batch_first=True)
        self.add_module(kind, rnn)  # named `lstm` or `gru` in the state_dict
        self.norm = nn.LayerNorm(dim)

    def initial_state(
        self, batch_size: int, device: torch.device | str = "cpu", explore: bool = False
    ) -> RecurrentState:
        """Zeros (``explore`` changes nothing: a recurrent core has no spans to explore)."""
        zeros = torch.zeros(self.num_layers, batch_size, self.dim, device=device)
        return RecurrentState(zeros, zeros.clone() if self.kind == "lstm" else None)

    def refresh(self, state: RecurrentState) -> RecurrentState:
        """``state`` as it is: a recurrent state holds nothing computed by weights it will
        read with (``memory.MemoryTransformer.refresh``)."""
        return state

    def _run(self, x: torch.Tensor, state: RecurrentState) -> tuple[torch.Tensor, RecurrentState]:
        rnn = getattr(self, self.kind)
        if self.kind == "lstm":
            hidden, (h, c) = rnn(x, (state.h, state.c))
            return hidden, RecurrentState(h, c)
        hidden, h = rnn(x, state.h)
        return hidden, RecurrentState(h)

    def forward(
        self,
        x: torch.Tensor,
        state: RecurrentState,
        episode_start: torch.Tensor | None = None,
        span_credit: torch.Tensor | None = None,
    ):
        """Block mode: x (B, K, dim), episode_start (B, K) bool (``span_credit``: no spans,
        ignored)."""

        def reset(state: RecurrentState, start: torch.Tensor) -> RecurrentState:
            keep = (~start).to(x.dtype).view(1, -1, 1)
            return state.map(lambda s: s * keep)

        if episode_start is None or not bool(episode_start[:, 1:].any()):
            # One fused call when no episode starts inside the block (the common case).
            if episode_start is not None:
                state = reset(state, episode_start[:, 0])
            hidden, state = self._run(x, state)
        else:
            outputs = []
            for k in range(x.shape[1]):
                out, state = self._run(x[:, k : k + 1], reset(state, episode_start[:, k]))
                outputs.append(out)
            hidden = torch.cat(outputs, dim=1)
        zero = x.new_zeros(())
        return CoreOutput(self.norm(hidden), state.map(torch.Tensor.detach), zero, 1.0)

    def step(
        self, x: torch.Tensor, state: RecurrentState, episode_start: torch.Tensor | None = None
    ):
        """Step mode: x (B, dim), episode_start (B,) bool."""
        start = None if episode_start is None else episode_start[:, None]
        out = self.forward(x[:, None], state, start)
        return CoreOutput(out.hidden[:, 0], out.state, out.aux_loss, out.memory_size)
