"""The memory transformer core: pre-norm decoder layers attending over [memory; block].

Two modes that agree to float error (tested):
- ``forward`` (block mode): K timesteps in parallel, with the memory from before the block;
  used to train with backpropagation through time over the block.
- ``step`` (step mode): one timestep; used to act in an environment or to generate.
Inputs are already-embedded vectors; outputs are final-normed hidden states.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from memory.attention import MemoryAttention
from memory.config import MemoryConfig
from memory.kind import Call, Read, kind_classes
from memory.linear import Linear
from memory.state import LayerMemory, MemoryState
from memory.store import Slots, write_slot


@dataclass
class CoreOutput:
    """What one call of the core returns."""

    hidden: Tensor  # (B, K, dim) in block mode, (B, dim) in step mode: final-normed outputs
    state: MemoryState | None  # the memory after this call, detached (None: not wanted)
    aux_loss: Tensor  # scalar: the kind's auxiliary loss for this call (0: none, or no gradients)
    # average |C_t|: memories with m_ti > 0 per query, over queries and layers; a 0-d float64
    # tensor on the core's device, read (float()) when the caller can wait for the device
    memory_size: Tensor | float
    spans: tuple[Tensor, ...] | None = None  # per layer, e_i of the call's new memories (B, K)


@dataclass
class BufferStep:
    """A step without gradients planned in the layers' buffers (`MemoryTransformer.plan_step`):
    the state it leaves (its stores not yet grown by the step), where each layer writes its
    memory, and the call every layer sees."""

    state: MemoryState
    buffers: list[Slots]
    slots: list[int]  # the slot of each layer's buffer that the step writes
    writes: list[list[Tensor]]  # that slot's views in each field of the buffer (eager steps)
    call: Call


class MemoryLayer(nn.Module):
    """Pre-norm decoder layer: h + attention(LN(h) over memory), then h + FFN(LN(h))."""

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(cfg.dim)
        self.attention = MemoryAttention(cfg)
        self.kind = kind_classes()[cfg.kind](cfg)
        self.ffn_norm = nn.LayerNorm(cfg.dim)
        self.ffn = nn.Sequential(
            Linear(cfg.dim, cfg.ffn_dim), nn.ReLU(), Linear(cfg.ffn_dim, cfg.dim)
        )
        self.dropout = cfg.dropout

    def forward(
        self, h: Tensor, memory: LayerMemory, call: Call
    ) -> tuple[Tensor, Read, Tensor | None]:
        """The layer's output, what its memory gave the attention, and the spans of the new
        memories (None for kinds without a span per memory)."""
        x = self.attention_norm(h)  # the memories h_i of this layer are these normed inputs
        read = self.kind.read(self.attention, memory, x, call)
        keep = self.kind.learns_from_attention and torch.is_grad_enabled()
        attended, weights = self.attention(
            read.queries, read.segments, read.width, read.window, keep
        )
        if weights is not None:
            usage = self.kind.attention_loss(weights, read.slots, call)
            read = read._replace(aux_loss=read.aux_loss + usage)
        spans = None if read.slots is None else read.slots.span
        new_spans = None if spans is None else spans[:, spans.shape[1] - call.num_queries :]
        return self.feed_forward(h, attended), read, new_spans

    def step_in_buffer(
        self, h: Tensor, buffer: Slots, slot: Sequence[Tensor] | Tensor, call: Call
    ) -> tuple[Tensor, Tensor, Tensor | None]:
        """Step mode without gradients for h (B, dim): writes the step's memory into a slot of
        the ``recent`` store's ``buffer`` (`write_slot`'s ``slot``) and attends over the whole
        buffer, whose shapes change only when it is compacted (its slots after the step's are
        empty, and masked). Returns the output (B, dim), the count of `Read` and the new
        memory's span (B, 1)."""
        q, new = self.kind.step_memory(self.attention, self.attention_norm(h), call)
        write_slot(buffer, slot, new)
        segment, count, relative = self.kind.read_buffer(buffer, call)
        return self.feed_forward(h, self.attention.step(q, segment, relative)), count, new.span

    def feed_forward(self, h: Tensor, attended: Tensor) -> Tensor:
        h = h + self.residual(attended)
        return h + self.residual(self.ffn(self.ffn_norm(h)))

    def residual(self, branch: Tensor) -> Tensor:
        if self.dropout == 0:
            return branch
        return F.dropout(branch, self.dropout, self.training)


class MemoryTransformer(nn.Module):
    """Transformer core with a per-layer attention memory of kind ``cfg.kind``.

    >>> core = MemoryTransformer(MemoryConfig(kind="expire_span"))
    >>> state = core.initial_state(batch_size=8)
    >>> out = core(x, state, episode_start)       # x (8, K, 64), episode_start (8, K) bool
    >>> out = core.step(x_t, out.state, start_t)  # x_t (8, 64), start_t (8,) bool

    ``episode_start[b, k]`` marks timestep k of element b as the first of a new episode:
    from it on, element b attends to nothing earlier.
    """

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(MemoryLayer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.dim)
        self.steps_in_buffers = all(layer.kind.steps_in_buffer for layer in self.layers)
        self.penalises_span = all(layer.kind.penalises_span for layer in self.layers)
        self.pulls_attended = cfg.kind == "expire_span"

    def initial_state(
        self, batch_size: int, device: torch.device | str | None = None
    ) -> MemoryState:
        """An empty memory for ``batch_size`` sequences (also the way to change batch size)."""
        if device is None:
            device = self.final_norm.weight.device
        dtype = self.final_norm.weight.dtype
        return MemoryState(
            time=0,
            episode_begin=torch.zeros(batch_size, dtype=torch.long, device=device),
            layers=tuple(
                layer.kind.initial_memory(batch_size, device, dtype) for layer in self.layers
            ),
        )

    def set_aux_loss_coef(self, coef: float) -> None:
        """The span penalty's alpha from now on (memory.aux_loss_coef at the start): a learner
        may spend less memory once its task is solved (``agent.held_aux_loss_coef``)."""
        for layer in self.layers:
            if not layer.kind.penalises_span:
                raise ValueError(f"memory.kind={self.cfg.kind} has no span penalty to weigh")
            layer.kind.coef = coef

    def set_attended_span_coef(self, coef: float) -> None:
        """The attended pull's weight from now on (memory.attended_span_coef at the start): a
        solved task's cue may need a stronger pull against a stronger span penalty
        (``agent.held_attended_span_coef``)."""
        if self.cfg.kind != "expire_span":
            raise ValueError(f"memory.kind={self.cfg.kind} has no attended pull to weigh")
        for layer in self.layers:
            layer.kind.attended_coef = coef
            layer.kind.learns_from_attention = coef > 0

    @torch.no_grad()
    def refresh(self, state: MemoryState) -> MemoryState:
        """``state`` with the keys, values and spans of its memories recomputed with the
        current weights. Step mode caches them when a memory is written; after the weights
        change (an update), a memory written before reads differently in step mode than in
        block mode with gradients, which recomputes them. Refreshing after every update makes
        acting and learning read every memory alike."""
        layers = tuple(
            layer.kind.refresh(layer.attention, memory)
            for layer, memory in zip(self.layers, state.layers, strict=True)
        )
        return MemoryState(state.time, state.episode_begin, layers)

    @torch.no_grad()
    def save_state(self, state: MemoryState) -> dict:
        """``state`` for a checkpoint, as tensors and plain values (`load_state` reads it):
        every slot's position and the h_i its layer's kind needs (``MemoryKind.needed``;
        the spans recomputed by the current weights decide, as they will at the next step)."""
        state = self.refresh(state)
        needed = [
            layer.kind.needed(memory, state.time, state.episode_begin)
            for layer, memory in zip(self.layers, state.layers, strict=True)
        ]
        return state.state_dict(needed)

    @torch.no_grad()
    def load_state(self, saved: dict, device: torch.device | str | None = None) -> MemoryState:
        """The memory `save_state` saved, on ``device`` (the core's by default), with the
        keys, values and spans it left out computed by the current weights, as `refresh`
        computes them."""
        cached = [partial(layer.kind.cached, layer.attention) for layer in self.layers]
        return MemoryState.from_state_dict(saved, device or self.final_norm.weight.device, cached)

    def forward(
        self,
        x: Tensor,
        state: MemoryState,
        episode_start: Tensor | None = None,
        next_state: bool = True,
    ) -> CoreOutput:
        """Block mode: x (B, K, dim), episode_start (B, K) bool (tensor or array) or None.
        With ``next_state`` False (a learner's minibatch, which discards the memory after the
        call) nothing is deleted for a next call and the output's ``state`` is None."""
        if x.dim() != 3 or x.shape[-1] != self.cfg.dim:
            raise ValueError(
                f"block mode expects x of shape (B, K, {self.cfg.dim}), got {tuple(x.shape)}"
            )
        return self._run(x, state, episode_start, in_place=False, next_state=next_state)

    def step(
        self, x: Tensor, state: MemoryState, episode_start: Tensor | None = None
    ) -> CoreOutput:
        """Step mode: x (B, dim), episode_start (B,) bool or None. Without gradients it
        appends to the memory in place (older states stay valid); with gradients it is
        block mode with K = 1."""
        if x.dim() != 2 or x.shape[-1] != self.cfg.dim:
            raise ValueError(
                f"step mode expects x of shape (B, {self.cfg.dim}), got {tuple(x.shape)}"
            )
        if episode_start is not None and episode_start.shape != x.shape[:1]:
            raise ValueError(
                f"episode_start must have shape {tuple(x.shape[:1])} in step mode, "
                f"got {tuple(episode_start.shape)}"
            )
        if not torch.is_grad_enabled() and self.steps_in_buffers:
            return self._step_in_buffers(x, state, episode_start)
        starts = None if episode_start is None else episode_start[:, None]
        out = self._run(x[:, None], state, starts, in_place=not torch.is_grad_enabled())
        out.hidden = out.hidden[:, 0]
        return out

    def _step_in_buffers(
        self, x: Tensor, state: MemoryState, episode_start: Tensor | None
    ) -> CoreOutput:
        """Step mode without gradients for kinds that step in their buffer: each layer
        writes its memory into its store's buffer and attends over it up to its last memory."""
        plan = self.plan_step(state, x.shape[0], episode_start, x.dtype)
        hidden, count, spans = layers_in_buffers(self, x, plan.buffers, plan.writes, plan.call)
        return self.planned_output(plan, hidden, count, spans)

    def plan_step(
        self, state: MemoryState, batch: int, episode_start: Tensor | None, dtype: torch.dtype
    ) -> BufferStep:
        """Where a step without gradients of ``batch`` inputs from ``state`` (``episode_start``
        (B,) or None) writes each layer's memory (a store with room for it) and the call every
        layer sees; `planned_output` finishes it."""
        call, begin = self._step_call(state, batch, episode_start, dtype)
        memories = [
            layer.kind.with_room(memory, state.time, begin)
            for layer, memory in zip(self.layers, state.layers, strict=True)
        ]
        stores = [memory["recent"] for memory in memories]
        return BufferStep(
            state=MemoryState(state.time + 1, begin, tuple(memories)),
            buffers=[store.buffer for store in stores],
            slots=[store.length for store in stores],
            writes=[store.slot(store.length) for store in stores],
            call=call,
        )

    def _step_call(
        self, state: MemoryState, batch: int, episode_start: Tensor | None, dtype: torch.dtype
    ) -> tuple[Call, Tensor]:
        """`_call` for one step in the buffers, whose start is its time as a tensor (B, 1) (an
        input of a compiled step), and the episode begins after the step (B,), found once."""
        self._check_batch(state, batch)
        time, begin = state.time, state.episode_begin
        if episode_start is not None:
            begin = torch.where(self._as_starts(episode_start, state.device), time, begin)
        if isinstance(time, Tensor):
            positions = time.expand(batch, 1)
        else:
            positions = begin.new_full((batch, 1), time)
        call = Call(
            start=positions,
            positions=positions,
            query_begin=begin[:, None],
            memory_begin=state.episode_begin,
            in_place=True,
            recompute=False,
            next_state=True,
            fixed_shapes=state.fixed_shapes,
            dtype=dtype,
            offsets=None,
        )
        return call, begin

    def planned_output(
        self, plan: BufferStep, hidden: Tensor, count: Tensor, spans: tuple[Tensor, ...] | None
    ) -> CoreOutput:
        """The output of the step ``plan``, whose layers gave ``hidden`` (B, dim), the
        ``count`` of keys seen and the new memories' ``spans``."""
        state = plan.state
        layers = tuple(memory.replace(recent=memory["recent"].grown(1)) for memory in state.layers)
        zero = torch.zeros((), dtype=hidden.dtype, device=hidden.device)
        memory_size = self._memory_size(count, hidden.shape[0])
        return CoreOutput(hidden, replace(state, layers=layers), zero, memory_size, spans)

    def _memory_size(self, count: Tensor, queries: int) -> Tensor:
        """Average memories seen per query and layer, from the count of keys seen by
        ``queries`` queries over all layers."""
        pairs = queries * len(self.layers)
        return (count.double() - pairs) / pairs  # a query seeing itself is no memory

    def _run(
        self,
        x: Tensor,
        state: MemoryState,
        episode_start: Tensor | None,
        in_place: bool,
        next_state: bool = True,
    ) -> CoreOutput:
        batch, length, _ = x.shape
        call = self._call(state, batch, length, episode_start, in_place, next_state, x.dtype)
        h = x
        reads, spans = [], []
        for layer, memory in zip(self.layers, state.layers, strict=True):
            h, read, span = layer(h, memory, call)
            reads.append(read)
            spans.append(span)
        memory_size = self._memory_size(
            sum((r.count for r in reads[1:]), reads[0].count), batch * length
        )
        new_state = None
        if next_state:
            new_state = MemoryState(call.next_time, call.next_begin, tuple(r.memory for r in reads))
        aux_loss = sum(r.aux_loss for r in reads)
        spans = None if spans[0] is None else tuple(span.detach() for span in spans)
        return CoreOutput(self.final_norm(h), new_state, aux_loss, memory_size, spans)

    def _call(
        self,
        state: MemoryState,
        batch: int,
        length: int,
        episode_start: Tensor | None,
        in_place: bool,
        next_state: bool,
        dtype: torch.dtype,
    ) -> Call:
        self._check_batch(state, batch)
        device, time = state.device, state.time
        if isinstance(time, Tensor):
            positions = (time + torch.arange(length, device=device)).expand(batch, -1)
        elif length == 1:  # (a step: one operation)
            positions = state.episode_begin.new_full((batch, 1), time)
        else:
            positions = torch.arange(time, time + length, device=device).expand(batch, -1)
        query_begin = state.episode_begin[:, None]
        if episode_start is None:
            query_begin = query_begin.expand(batch, length)
        else:
            if episode_start.shape != (batch, length):
                raise ValueError(
                    f"episode_start must have shape {(batch, length)} (one flag per timestep), "
                    f"got {tuple(episode_start.shape)}"
                )
            starts = self._as_starts(episode_start, device)
            query_begin = torch.where(starts, positions, query_begin)
            if length > 1:
                query_begin = query_begin.cummax(1).values
        return Call(
            start=state.time,
            positions=positions,
            query_begin=query_begin,
            memory_begin=state.episode_begin,
            in_place=in_place,
            next_state=next_state,
            fixed_shapes=state.fixed_shapes,
            recompute=torch.is_grad_enabled(),
            dtype=dtype,
            offsets=torch.arange(length, device=device, dtype=dtype) if length > 1 else None,
        )

    @staticmethod
    def _check_batch(state: MemoryState, batch: int) -> None:
        if state.batch_size != batch:
            raise ValueError(
                f"the state holds {state.batch_size} sequences but the input has {batch}; "
                "start a new state with core.initial_state(batch_size) to change batch size"
            )

    @staticmethod
    def _as_starts(episode_start: Tensor, device: torch.device) -> Tensor:
        """``episode_start`` (a tensor or an array) as a bool tensor on ``device``."""
        if isinstance(episode_start, Tensor) and (episode_start.dtype, episode_start.device) == (
            torch.bool,
            device,
        ):
            return episode_start
        return torch.as_tensor(episode_start, dtype=torch.bool, device=device)


def layers_in_buffers(
    core: MemoryTransformer,
    x: Tensor,
    buffers: list[Slots],
    slots: list[list[Tensor]] | list[Tensor],
    call: Call,
) -> tuple[Tensor, Tensor, tuple[Tensor, ...] | None]:
    """The final-normed output (B, dim) of the core's layers for one step ``x`` (B, dim), writing
    each layer's memory into slot ``slots[l]`` of ``buffers[l]`` (`write_slot`); the count
    of keys seen, and the spans of the new memories (None for kinds without)."""
    h, counts, spans = x, [], []
    for layer, buffer, slot in zip(core.layers, buffers, slots, strict=True):
        h, seen, span = layer.step_in_buffer(h, buffer, slot, call)
        counts, spans = counts + [seen], spans + [span]
    count = sum(counts[1:], counts[0])
    return core.final_norm(h), count, None if spans[0] is None else tuple(spans)
