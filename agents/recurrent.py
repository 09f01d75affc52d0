"""Recurrent cores (LSTM, GRU) with the memory transformer's interface: the baselines."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from memory import CoreOutput

RECURRENT_KINDS = ("lstm", "gru")


class RecurrentState(NamedTuple):
    h: torch.Tensor  # (num_layers, B, dim)
    c: torch.Tensor | None = None  # (num_layers, B, dim), the LSTM's cell; None for a GRU

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> RecurrentState:
        return RecurrentState(fn(self.h), None if self.c is None else fn(self.c))

    def select(self, index, fixed_shapes: bool = False) -> RecurrentState:
        """The state of the batch elements ``index`` (e.g. a minibatch of environments); its
        shapes are fixed whatever ``fixed_shapes`` says (`memory.MemoryState.select`)."""
        return self.map(lambda x: x[:, index])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The state as tensors, as `memory.MemoryState.state_dict` gives it."""
        return {key: x.detach().cpu().clone() for key, x in self._asdict().items() if x is not None}

    @classmethod
    def from_state_dict(
        cls, saved: dict[str, torch.Tensor], device: torch.device | str
    ) -> RecurrentState:
        return cls(**saved).map(lambda x: x.to(device))


class GRURecurrence(torch.autograd.Function):
    """The GRU's loop over time, given every step's input projection: forward and a
    hand-written backward through time, each a few batched operations per step (autograd
    through the same loop records about 20 per step and took longer than PyTorch's GRU).

    Time-major tensors: ``inputs`` (K, B, 3 dim), the input projection W_i x + b_i with the
    reset, update and new gates' parts in nn.GRU's order; ``h`` (B, dim); ``keep`` (K, B, 1),
    0 where an episode starts (the state is zeroed before that step) or None. Returns every
    step's state (K, B, dim).
    """

    @staticmethod
    def forward(ctx, inputs, h, weight_hh, bias_hh, keep):
        K, B, three_d = inputs.shape
        d = three_d // 3
        states = inputs.new_empty(K, B, d)
        previous = inputs.new_empty(K, B, d)  # each step's state before it, after any reset
        from_state = inputs.new_empty(K, B, three_d)  # W_h h + b_h
        reset_update = inputs.new_empty(K, B, 2 * d)
        new = inputs.new_empty(K, B, d)
        # Each step's views, taken at once (indexing inside the loop cost as much as its math)
        steps = zip(
            inputs[..., : 2 * d].unbind(0),
            inputs[..., 2 * d :].unbind(0),
            keep.unbind(0) if keep is not None else [None] * K,
            previous.unbind(0),
            from_state.unbind(0),
            from_state[..., : 2 * d].unbind(0),
            from_state[..., 2 * d :].unbind(0),
            reset_update.unbind(0),
            new.unbind(0),
            states.unbind(0),
            strict=True,
        )
        w_hh = weight_hh.t()
        for input_ru, input_n, kept, before, hidden, hidden_ru, hidden_n, ru, n, after in steps:
            h = before.copy_(h) if kept is None else torch.mul(h, kept, out=before)
            torch.addmm(bias_hh, h, w_hh, out=hidden)
            torch.add(input_ru, hidden_ru, out=ru).sigmoid_()
            torch.addcmul(input_n, ru[:, :d], hidden_n, out=n).tanh_()
            h = torch.lerp(n, h, ru[:, d:], out=after)  # (1 - z) n + z h
        ctx.save_for_backward(previous, from_state, reset_update, new, weight_hh, keep)
        return states

    @staticmethod
    def backward(ctx, grad_states):
        previous, from_state, reset_update, new, weight_hh, keep = ctx.saved_tensors
        K, B, d = new.shape
        reset, update = reset_update[..., :d], reset_update[..., d:]
        # With dh the gradient of a step's state, the gates' pre-activations get
        # d pre_new = dh (1 - z)(1 - n^2), d pre_update = dh (h - n) z (1 - z) and
        # d pre_reset = d pre_new (W_hn h + b_hn) r (1 - r); d (W_h h + b_h) is those of the
        # reset and update gates and d pre_new r. Their factors of dh, for every step at once:
        to_new = (1 - update) * (1 - new.square())
        to_reset = to_new * from_state[..., 2 * d :] * reset * (1 - reset)
        to_update = (previous - new) * update * (1 - update)
        to_from_state = torch.stack([to_reset, to_update, to_new * reset], dim=2)
        grad_from_state = torch.empty_like(to_from_state)  # (K, B, 3, dim)
        grad_state = torch.empty_like(new)  # dh of each step
        grad_state[K - 1] = grad_states[K - 1]
        steps = zip(
            grad_state.unbind(0),
            to_from_state.unbind(0),
            grad_from_state.unbind(0),
            update.unbind(0),
            keep.unbind(0) if keep is not None else [None] * K,
            strict=True,
        )
        given, into = grad_states.unbind(0), grad_state.unbind(0)
        for k, (dh, to_gates, grad_gates, z, kept) in reversed(list(enumerate(steps))):
            torch.mul(dh[:, None], to_gates, out=grad_gates)
            back = torch.addmm(dh * z, grad_gates.view(B, 3 * d), weight_hh)
            if kept is not None:
                back = back * kept
            if k == 0:
                grad_h = back
            else:
                torch.add(given[k - 1], back, out=into[k - 1])
        flat = grad_from_state.view(K * B, 3 * d)
        grad_inputs = torch.cat([flat[:, : 2 * d], (grad_state * to_new).view(K * B, d)], dim=1)
        grad_weight = flat.t() @ previous.reshape(K * B, d)
        return grad_inputs.view(K, B, 3 * d), grad_h, grad_weight, flat.sum(0), None


PARAMETER_NAMES = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")  # nn.GRU's, in its order


class GRULayers(nn.Module):
    """`torch.nn.GRU`'s layers (batch first; its parameter names, shapes and initialisation)
    written for BPTT on the CPU: each layer's input projection for the whole block is one
    matrix product, then `GRURecurrence` runs the loop over time and zeroes the state where an
    episode starts, with no cut of the block. PyTorch's own CPU GRU took 4 times as long as
    its LSTM forward and backward (`benchmarks/recurrent_cells.py`)."""

    def __init__(self, dim: int, num_layers: int) -> None:
        super().__init__()
        self.dim = dim
        self.num_layers = num_layers
        bound = dim**-0.5
        for layer in range(num_layers):  # (so a seed draws nn.GRU's weights)
            for name in PARAMETER_NAMES:
                shape = (3 * dim, dim) if name.startswith("weight") else (3 * dim,)
                weight = nn.Parameter(torch.empty(shape).uniform_(-bound, bound))
                self.register_parameter(f"{name}_l{layer}", weight)

    def forward(
        self, x: torch.Tensor, h: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, K, dim), h (num_layers, B, dim), keep (B, K): 0 where an episode starts (the
        state is zeroed before that step), else 1. Returns every step's top-layer output
        (B, K, dim) and the state after the block (num_layers, B, dim)."""
        x = x.transpose(0, 1)
        keep = None if keep is None else keep.t()[..., None].contiguous()
        finals = []
        for layer in range(self.num_layers):
            weights = [getattr(self, f"{name}_l{layer}") for name in PARAMETER_NAMES]
            inputs = F.linear(x, weights[0], weights[2]).contiguous()  # (K, B, 3 dim)
            x = GRURecurrence.apply(inputs, h[layer], weights[1], weights[3], keep)
            finals.append(x[-1])
        return x.transpose(0, 1), torch.stack(finals)


class RecurrentCore(nn.Module):
    """A stack of LSTM or GRU layers (``kind``) that runs in block mode and step mode like
    `memory.MemoryTransformer`, so the agent swaps one for the other unchanged.

    The state is a `RecurrentState`. An `episode_start` flag zeroes the state of that element
    before the step it marks. `memory_size` is reported as 1: the core carries one summary
    vector per layer, not a set of past hidden states.
    """

    steps_in_buffers = False  # (`agents.core.Core`: no buffers to compile a step over)
    penalises_span = pulls_attended = False  # (no span penalty, no attended pull)

    def __init__(self, dim: int, num_layers: int = 1, kind: str = "lstm") -> None:
        super().__init__()
        if kind not in RECURRENT_KINDS:
            raise ValueError(f"kind={kind}: a recurrent core is one of {RECURRENT_KINDS}")
        self.dim = dim
        self.num_layers = num_layers
        self.kind = kind
        if kind == "lstm":
            self.lstm = nn.LSTM(dim, dim, num_layers, batch_first=True)
        else:
            self.gru = GRULayers(dim, num_layers)
        self.norm = nn.LayerNorm(dim)

    def initial_state(self, batch_size: int, device: torch.device | str = "cpu") -> RecurrentState:
        """Zeros."""
        zeros = torch.zeros(self.num_layers, batch_size, self.dim, device=device)
        return RecurrentState(zeros, zeros.clone() if self.kind == "lstm" else None)

    def refresh(self, state: RecurrentState) -> RecurrentState:
        """``state`` as it is: a recurrent state holds nothing computed by weights it will
        read with (``memory.MemoryTransformer.refresh``)."""
        return state

    def save_state(self, state: RecurrentState) -> dict[str, torch.Tensor]:
        """``state`` for a checkpoint (``memory.MemoryTransformer.save_state``)."""
        return state.state_dict()

    def load_state(self, saved: dict, device: torch.device | str) -> RecurrentState:
        return RecurrentState.from_state_dict(saved, device)

    def forward(
        self,
        x: torch.Tensor,
        state: RecurrentState,
        episode_start: torch.Tensor | None = None,
        next_state: bool = True,
    ):
        """Block mode: x (B, K, dim), episode_start (B, K) bool; ``next_state`` as for
        ``memory.MemoryTransformer.forward``."""
        if self.kind == "gru":
            keep = None if episode_start is None else (~episode_start).to(x.dtype)
            hidden, h = self.gru(x, state.h, keep)
            state = RecurrentState(h)
        else:
            hidden, state = self._lstm_between_starts(x, state, episode_start)
        zero = x.new_zeros(())
        state = state.map(torch.Tensor.detach) if next_state else None
        return CoreOutput(self.norm(hidden), state, zero, 1.0)

    def _lstm_between_starts(
        self, x: torch.Tensor, state: RecurrentState, episode_start: torch.Tensor | None
    ) -> tuple[torch.Tensor, RecurrentState]:
        """The block cut in time where any episode starts inside it, each piece one call of
        the LSTM over every environment from the state zeroed where an episode starts: one
        call for most blocks, a few where episodes start inside (a call per timestep was
        2-3 times slower at PPO's minibatches of 4-8 environments)."""
        if episode_start is None:
            hidden, (h, c) = self.lstm(x, (state.h, state.c))
            return hidden, RecurrentState(h, c)
        K = x.shape[1]
        cuts = (episode_start[:, 1:].any(0).nonzero()[:, 0] + 1).tolist()
        pieces = []
        for begin, end in zip([0, *cuts], [*cuts, K], strict=True):
            state = state.map(partial(torch.mul, (~episode_start[:, begin]).to(x.dtype)[:, None]))
            hidden, (h, c) = self.lstm(x[:, begin:end], (state.h, state.c))
            state = RecurrentState(h, c)
            pieces.append(hidden)
        return torch.cat(pieces, dim=1), state

    def step(
        self, x: torch.Tensor, state: RecurrentState, episode_start: torch.Tensor | None = None
    ):
        """Step mode: x (B, dim), episode_start (B,) bool."""
        start = None if episode_start is None else episode_start[:, None]
        out = self.forward(x[:, None], state, start)
        return CoreOutput(out.hidden[:, 0], out.state, out.aux_loss, out.memory_size)
