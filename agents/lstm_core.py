"""An LSTM core with the memory transformer's interface: the recurrent baseline."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from memory import CoreOutput


class LSTMState(NamedTuple):
    h: torch.Tensor  # (num_layers, B, dim)
    c: torch.Tensor  # (num_layers, B, dim)

    def select(self, index) -> LSTMState:
        """The state of the batch elements ``index`` (e.g. a minibatch of environments)."""
        return LSTMState(self.h[:, index], self.c[:, index])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as tensors, as `memory.MemoryState.state_dict` gives it."""
        return {"h": self.h.detach().cpu().clone(), "c": self.c.detach().cpu().clone()}

    @classmethod
    def from_state_dict(
        cls, saved: dict[str, torch.Tensor], device: torch.device | str
    ) -> LSTMState:
        return cls(saved["h"].to(device), saved["c"].to(device))


class LSTMCore(nn.Module):
    """A stack of LSTM layers that runs in block mode and step mode like
    `memory.MemoryTransformer`, so the agent swaps one for the other unchanged.

    The state is an `LSTMState(h, c)`. An `episode_start` flag zeroes the
    state of that element before the step it marks. `memory_size` is reported as 1: the
    core carries one summary vector per layer, not a set of past hidden states.
    """

    def __init__(self, dim: int, num_layers: int = 1) -> None:
        super().__init__()
        self.dim = dim
        self.num_layers = num_layers
        self.lstm = nn.LSTM(dim, dim, num_layers=num_layers, batch_first=True)
        self.norm = nn.LayerNorm(dim)

    def initial_state(
        self, batch_size: int, device: torch.device | str = "cpu", explore: bool = False
    ) -> LSTMState:
        """Zeros (``explore`` changes nothing: the LSTM has no spans to explore)."""
        zeros = torch.zeros(self.num_layers, batch_size, self.dim, device=device)
        return LSTMState(zeros, zeros.clone())

    def forward(
        self,
        x: torch.Tensor,
        state: LSTMState,
        episode_start: torch.Tensor | None = None,
        span_credit: torch.Tensor | None = None,
    ):
        """Block mode: x (B, K, dim), episode_start (B, K) bool (``span_credit``: no spans,
        ignored)."""
        h, c = state
        if episode_start is None or not bool(episode_start[:, 1:].any()):
            # One fused call when no episode starts inside the block (the common case).
            if episode_start is not None:
                keep = (~episode_start[:, 0]).to(x.dtype).view(1, -1, 1)
                h, c = h * keep, c * keep
            hidden, (h, c) = self.lstm(x, (h, c))
        else:
            outputs = []
            for k in range(x.shape[1]):
                keep = (~episode_start[:, k]).to(x.dtype).view(1, -1, 1)
                out, (h, c) = self.lstm(x[:, k : k + 1], (h * keep, c * keep))
                outputs.append(out)
            hidden = torch.cat(outputs, dim=1)
        zero = x.new_zeros(())
        return CoreOutput(self.norm(hidden), LSTMState(h.detach(), c.detach()), zero, 1.0)

    def step(self, x: torch.Tensor, state: LSTMState, episode_start: torch.Tensor | None = None):
        """Step mode: x (B, dim), episode_start (B,) bool."""
        start = None if episode_start is None else episode_start[:, None]
        out = self.forward(x[:, None], state, start)
        return CoreOutput(out.hidden[:, 0], out.state, out.aux_loss, out.memory_size)
