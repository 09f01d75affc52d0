"""Recurrent cores (LSTM, GRU) with the memory transformer's interface: the baselines."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
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

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        """Zeros."""
        zeros = torch.zeros(self.num_layers, batch_size, self.dim, device=device)
        return RecurrentState(zeros, zeros.clone() if self.kind == "lstm" else None)

    def refresh(self, state: RecurrentState) -> RecurrentState:
        """``state`` as it is: a recurrent state holds nothing computed by weights it will
        read with (``memory.MemoryTransformer.refresh``)."""
        return state

    def _run(self, x: torch.Tensor, state: RecurrentState) -> tuple[torch.Tensor, RecurrentState]:
        """The layers over ``x`` (B, K, dim) from ``state``."""
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
    ):
        """Block mode: x (B, K, dim), episode_start (B, K) bool."""
        if episode_start is None:
            hidden, state = self._run(x, state)
        else:
            hidden, state = self._run_between_starts(x, state, episode_start)
        zero = x.new_zeros(())
        return CoreOutput(self.norm(hidden), state.map(torch.Tensor.detach), zero, 1.0)

    def _run_between_starts(
        self, x: torch.Tensor, state: RecurrentState, episode_start: torch.Tensor
    ) -> tuple[torch.Tensor, RecurrentState]:
        """The block cut in time where any episode starts inside it, each piece one call of
        the layers over every environment from the state zeroed where an episode starts: one
        call for most blocks, a few where episodes start inside (a call per timestep was
        2-3 times slower at PPO's minibatches of 4-8 environments)."""
        K = x.shape[1]
        cuts = (episode_start[:, 1:].any(0).nonzero()[:, 0] + 1).tolist()
        pieces = []
        for begin, end in zip([0, *cuts], [*cuts, K], strict=True):
            state = state.map(partial(torch.mul, (~episode_start[:, begin]).to(x.dtype)[:, None]))
            hidden, state = self._run(x[:, begin:end], state)
            pieces.append(hidden)
        return torch.cat(pieces, dim=1), state

    def step(
        self, x: torch.Tensor, state: RecurrentState, episode_start: torch.Tensor | None = None
    ):
        """Step mode: x (B, dim), episode_start (B,) bool."""
        start = None if episode_start is None else episode_start[:, None]
        out = self.forward(x[:, None], state, start)
        return CoreOutput(out.hidden[:, 0], out.state, out.aux_loss, out.memory_size)
