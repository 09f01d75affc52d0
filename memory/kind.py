"""What every memory kind shares: which memories a query may see, masking, deletion.

A query at time t of batch element b may attend to memory i (time index i) when i is in
the same episode (i >= the episode begin seen by that query) and i <= t (causal; the
query sees itself). On top of that each kind defines a mask m_ti in [0, 1] (``mask``);
the attention weights are multiplied by it and renormalised (eq. 4, in
``memory.attention``). A memory
whose mask is 0 for the next query can never be seen again (every mask here only shrinks
as t grows) and is deleted (``alive``).
"""

from __future__ import annotations

import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from memory.attention import MemoryAttention, Segment, log_mask
from memory.config import MemoryConfig
from memory.state import LayerMemory
from memory.store import EMPTY, Slots, SlotStore

Alive = Callable[[Slots, int, Tensor], Tensor]
KIND_CLASSES: dict[str, type[MemoryKind]] = {}  # filled as MemoryKind subclasses are defined


def kind_classes() -> dict[str, type[MemoryKind]]:
    """Every memory kind by name: those of this package's modules (imported here, so that a
    new kind needs nothing but its module) and any other subclass defined before the call."""
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{__package__}.{module.name}")
    return dict(KIND_CLASSES)


def kind_names() -> tuple[str, ...]:
    """The names ``MemoryConfig.kind`` accepts."""
    return tuple(kind_classes())


@dataclass
class Call:
    """One call of the core (a block of Q >= 1 timesteps), as every layer sees it."""

    start: int | Tensor  # time index of the first query ((B, 1) in `step_in_buffers`)
    positions: Tensor  # (B, Q) int64: time index of each query (and of the memory it writes)
    query_begin: Tensor  # (B, Q) int64: episode begin seen by each query
    memory_begin: Tensor  # (B,) int64: episode begin before this call (that of the memories)
    in_place: bool  # step mode without gradients: append into the memory buffers
    recompute: bool  # gradients on: recompute memory keys, values and spans with live weights
    next_state: bool  # the memory after the call is wanted (False: nothing is deleted for it)
    fixed_shapes: bool  # the memory after the call keeps every slot, the dead ones emptied
    dtype: torch.dtype
    offsets: Tensor | None  # (Q,) t - start of every query, in dtype; None for one query

    @property
    def num_queries(self) -> int:
        return self.positions.shape[1]

    @property
    def next_time(self) -> int:
        return self.start + self.num_queries

    @property
    def next_begin(self) -> Tensor:
        return self.query_begin[:, -1]

    _columns: tuple[Tensor, Tensor] | None = field(default=None, init=False, repr=False)

    @property
    def columns(self) -> tuple[Tensor, Tensor]:
        """The queries' episode begins and time indices as columns (B, Q, 1) against the keys'
        rows: made once a call, for every layer (kept without `functools.cached_property`,
        whose lock torch.compile cannot trace)."""
        if self._columns is None:
            self._columns = self.query_begin[:, :, None], self.positions[:, :, None]
        return self._columns

    def visible(self, position: Tensor) -> Tensor:
        """Whether query t may see memory i at all: same episode and i <= t, (B, Q, N)."""
        if self.num_queries == 1:  # (i <= t for every memory of a step)
            return (position >= self.query_begin)[:, None, :]
        begin, time = self.columns
        position = position[:, None, :]
        return (position >= begin) & (position <= time)


class Read(NamedTuple):
    """What a layer's memory gives its attention for one call."""

    queries: Tensor  # (B, H, Q, head_dim): the queries of the call's steps
    segments: list[Segment]  # attended to jointly; the last one ends with the position window
    width: int  # keys in the position window (see MemoryAttention.forward)
    window: Tensor | None  # their time offsets, or None when consecutive
    aux_loss: Tensor  # the kind's auxiliary loss for this call and layer
    count: Tensor  # sum over queries of the number of keys with m_ti > 0 (mean over heads)
    memory: LayerMemory | None  # this layer's memory after the call (None: not wanted)
    slots: Slots | None = None  # the keys' memories, in order (``attention_loss``)


def ramp_mask(start: Tensor, offsets: Tensor | None, ramp: float) -> Tensor:
    """clamp(start_i - offset_t / R, 0, 1) for every query offset: (..., Q, N) from (..., N)."""
    return ramp_argument(start, offsets, ramp).clamp(0, 1)


def ramp_argument(start: Tensor, offsets: Tensor | None, ramp: float) -> Tensor:
    """start_i - offset_t / R, what `ramp_mask` clamps."""
    if offsets is None:
        return start[..., None, :]
    return start[..., None, :] - (offsets / ramp)[:, None]


def ramp_log_mask(
    start: Tensor, offsets: Tensor | None, ramp: float, visible: Tensor
) -> tuple[Tensor, Tensor]:
    """log m_ti and m_ti of a ramp mask: `ramp_mask` where query t may see memory i
    (``visible`` (B, Q, N)), 0 elsewhere; through `RampLogMask` where gradients reach
    ``start``, and m_ti then carries none."""
    if torch.is_grad_enabled() and start.requires_grad:
        return RampLogMask.apply(start, offsets, ramp, visible)
    m, _ = _ramp_mask(start, offsets, ramp, visible)
    return m.log(), m


def _ramp_mask(
    start: Tensor, offsets: Tensor | None, ramp: float, visible: Tensor
) -> tuple[Tensor, Tensor]:
    """m_ti, and the argument it clamps (`ramp_argument`)."""
    argument = ramp_argument(start, offsets, ramp)
    m = argument.clamp(0, 1) * (visible if argument.dim() == 3 else visible[:, None])
    return m, argument


def log_without_zeros(m: Tensor) -> Tensor:
    """``m.log()`` (-inf where m = 0) without taking the log of 0 on a CPU, where it took as
    long as ten logs of other values, and most of a learner's block mask is 0
    (docs/performance.md); on a GPU the log itself, one operation (a kernel launch) where this
    is three. (A step's mask, without gradients, is small: there the calls count, not the logs.)"""
    if m.device.type != "cpu":
        return m.log()
    zero = m == 0
    return torch.where(zero, -math.inf, torch.where(zero, 1.0, m).log_())


class RampLogMask(torch.autograd.Function):
    """`ramp_log_mask` in one node, whose backward passes d log m / d m = 1 / m to start_i
    where the ramp is on it (0 < m <= 1 unclamped): what the clamp, the visibility's product
    and the log would pass back in a node each."""

    @staticmethod
    def forward(
        ctx, start: Tensor, offsets: Tensor | None, ramp: float, visible: Tensor
    ) -> tuple[Tensor, Tensor]:
        m, argument = _ramp_mask(start, offsets, ramp, visible)
        log_m = log_without_zeros(m)
        ctx.save_for_backward(argument, m)
        ctx.mark_non_differentiable(m)
        ctx.set_materialize_grads(False)
        return log_m, m

    @staticmethod
    def backward(ctx, d_log: Tensor, _: None) -> tuple[Tensor | None, ...]:
        argument, m = ctx.saved_tensors
        on_ramp = (m >= torch.finfo(m.dtype).tiny) & (argument <= 1)
        return torch.where(on_ramp, d_log / m, 0.0).sum(-2), None, None, None


class MemoryKind(nn.Module):
    """How one layer keeps, masks, penalises and deletes its memories; one subclass per
    paper, in a module of this package named after it (docs/memory-kinds.md).

    A subclass that sets ``name`` is registered under it: ``MemoryConfig(kind=name)`` and
    ``configs/memory/<name>.yaml`` select it.
    """

    name: str  # the kind's name in MemoryConfig.kind
    stores_span = False  # a span per memory (``span``) is stored with it
    learns_from_attention = False  # ``attention_loss`` is taken in training
    # the memories of ``recent`` are always consecutive time steps (or invisible ones): deleted
    # by age and episode only, never one from between two kept ones (``window_of``)
    consecutive = False
    penalises_span = False  # ``loss`` is a span penalty weighed by ``coef`` (memory.aux_loss_coef)

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            KIND_CLASSES[cls.name] = cls

    def __init__(self, cfg: MemoryConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.max_span = cfg.max_span
        self.window = cfg.block_len - 1  # memories before a call that can get a position term

    # --- what subclasses define ------------------------------------------------------
    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """Raises ValueError, saying what is wrong and how to fix it, unless ``options``
        (``MemoryConfig.options``) are this kind's; a kind without options takes none."""
        if options:
            raise ValueError(
                f"memory kind {cls.name!r} takes no memory.options; got {sorted(options)}"
            )

    def initial_memory(
        self, batch: int, device: torch.device | str, dtype: torch.dtype
    ) -> LayerMemory:
        """An empty memory of this layer for ``batch`` sequences."""
        return LayerMemory(recent=self.empty_store(batch, device, dtype, self.stores_span))

    def ramp_start(self, relative: Tensor, span: Tensor | None) -> Tensor | None:
        """For a mask that is a ramp, `ramp_mask` of ``start`` over ``cfg.ramp`` steps: start_i
        of memories at i = s + relative (B, N) with spans ``span``, (B, N) or per head
        (B, H, N); None for another mask (the default)."""
        return None

    def span(self, hidden: Tensor) -> Tensor | None:
        """Per-memory value computed when a memory is written (Expire-Span's e_i), for
        memories ``hidden`` (B, N, dim)."""
        return None

    def mask(self, relative: Tensor, span: Tensor | None, offsets: Tensor | None) -> Tensor:
        """m_ti for memories at i = s + relative (B, N) and queries at t = s + offsets (Q,)
        (None: one query, t = s). Returns (B, Q, N), or (B, H, Q, N) when every head has
        its own mask; bool for a hard mask, else float in [0, 1]."""
        raise NotImplementedError

    def loss(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        """Auxiliary loss of this layer for the call over the memories ``slots`` it sees;
        ``mask`` already hides invisible keys."""
        return mask.new_zeros(())

    @property
    def restricts(self) -> bool:
        """Whether ``restrict`` hides keys from calls in the module's present mode."""
        return False

    def restrict(self, mask: Tensor, slots: Slots, call: Call) -> Tensor:
        """The mask the attention uses, (B, Q, N) or (B, H, Q, N): ``mask`` without the keys
        a kind hides from this call only, keeping them in memory (none here)."""
        return mask

    def attention_loss(self, weights: Tensor, slots: Slots, call: Call) -> Tensor:
        """A loss on the memories from the attention weights the call's queries gave them,
        (B, H, Q, N) in the order of ``slots``, detached (``learns_from_attention``)."""
        raise NotImplementedError

    # --- shared machinery ------------------------------------------------------------
    @property
    def steps_in_buffer(self) -> bool:
        """Whether step mode without gradients writes the step's memory straight into the
        ``recent`` store's buffer and reads it with ``read_buffer``: unless the kind reads its
        own way (overrides ``read``), which it then does in every mode."""
        return type(self).read is MemoryKind.read

    def empty_store(
        self, batch: int, device: torch.device | str, dtype: torch.dtype, with_span: bool
    ) -> SlotStore:
        cfg = self.cfg
        return SlotStore.empty(batch, cfg.dim, cfg.num_heads, with_span, device, dtype)

    def read(self, attention: MemoryAttention, memory: LayerMemory, x: Tensor, call: Call) -> Read:
        """What the layer's memory gives the attention of ``call``, whose steps write the
        memories ``x`` (B, Q, dim), and the layer's memory after the call."""
        queries, slots, recent = self.extend_recent(attention, memory, x, call)
        m, count, log_m = self.visible_mask(slots, call)
        if call.recompute and m.dtype != torch.bool:  # a loss to train on: only with gradients
            aux_loss = self.loss(m, slots, call)
        else:
            aux_loss = torch.zeros((), dtype=call.dtype, device=m.device)
        segment = self.segment(m, log_m, slots, call)
        if not call.in_place and call.next_state:
            recent = self.delete(slots, call, self.alive)
        after = memory.replace(recent=recent) if call.next_state else None
        window = self.window_of(slots.position, call)
        return Read(queries, [segment], *window, aux_loss, count, after, slots)

    def read_buffer(self, buffer: Slots, call: Call) -> tuple[Segment, Tensor, Tensor]:
        """Step mode without gradients (``steps_in_buffer``), after the step's memory was
        written into the ``recent`` store's buffer: the whole buffer as one segment, its
        empty and dead slots masked, the count of ``Read``, and the memories' time offsets
        i - t (B, N) from the step (`MemoryAttention.step`'s position rows)."""
        relative = buffer.position - call.start
        start = None if self.restricts else self.ramp_start(relative, buffer.span)
        if start is None:  # another mask, or keys hidden from this step: read as a call reads
            m, count, log_m = self.visible_mask(buffer, call)
            return self.segment(m, log_m, buffer, call), count, relative
        # the ramp (`ramp_log_mask`) of one query, without its query axis until the log mask
        visible = buffer.position >= call.query_begin  # (B, N)
        m = start.clamp(0, 1) * (visible if start.dim() == 2 else visible[:, None])
        count = torch.count_nonzero(m)
        if m.dim() == 3:  # per-head masks
            count = count / m.shape[1]
        log_m = m.log().view(m.shape[0], -1, 1, m.shape[-1])  # (B, 1 or H, 1, N)
        return Segment(buffer.keys, buffer.values, log_m), count, relative

    def visible_mask(self, slots: Slots, call: Call) -> tuple[Tensor, Tensor, Tensor | None]:
        """m_ti of the call's queries for ``slots``, 0 where a query may not see a memory at
        all; how many are > 0 (per-head masks: the mean over heads); and for a ramp mask
        (``ramp_start``) its log, which `ramp_log_mask` computes with it (m_ti then carries no
        gradient: the log does), else None."""
        relative = slots.position - call.start  # (integers: the mask's arithmetic converts)
        visible = call.visible(slots.position)
        start = self.ramp_start(relative, slots.span)
        if start is None:
            m, log_m = self.mask(relative, slots.span, call.offsets), None
            visible = visible[:, None] if m.dim() == 4 else visible
            m = m & visible if m.dtype == torch.bool else m * visible
        else:
            log_m, m = ramp_log_mask(start, call.offsets, self.cfg.ramp, visible)
        count = torch.count_nonzero(m)
        if m.dim() == 4:
            count = count / m.shape[1]
        return m, count, log_m

    def segment(self, m: Tensor, log_m: Tensor | None, slots: Slots, call: Call) -> Segment:
        """The keys and values of ``slots`` with the attention's log mask for ``m`` as the
        call restricts it (``restrict``); ``log_m``: log m where `visible_mask` gave it."""
        restricted = self.restrict(m, slots, call)
        if log_m is None:
            log_m = log_mask(restricted, call.dtype)
        elif restricted is not m:  # (keys hidden from this call)
            log_m = log_m.masked_fill(restricted == 0, -math.inf)
        return Segment(slots.keys, slots.values, log_m if log_m.dim() == 4 else log_m[:, None])

    def with_room(self, memory: LayerMemory, time: int, begin: Tensor) -> LayerMemory:
        """The memory with room in its ``recent`` store for the memory of a step at ``time``
        whose episode began at ``begin`` (B,) (``steps_in_buffer``)."""
        room = memory["recent"].with_room(1, lambda slots: self.alive(slots, time, begin))
        return memory.replace(recent=room)

    def needed(self, memory: LayerMemory, time: int, begin: Tensor) -> dict[str, Tensor]:
        """Per store, the slots (B, N) whose h_i a checkpoint keeps: those that a query at
        ``time`` or later, in an episode begun at ``begin`` (B,) or later, can see. Dead ones
        (step mode leaves them in its buffers until they fill) keep their place, so that the
        layout, which the order of floating-point sums follows, stays; their h_i matter only
        where a span is computed from it, and elsewhere load as zeros, masked all the same."""
        recent = memory["recent"].view()
        if recent.span is not None:
            return {"recent": recent.position != EMPTY}
        return {"recent": self.alive(recent, time, begin)}

    def refresh(self, attention: MemoryAttention, memory: LayerMemory) -> LayerMemory:
        """The memory with every stored memory's key, value and span recomputed from its h_i
        with the current weights: what block mode with gradients reads (``extend``), so that
        acting from the refreshed memory and learning from it see one policy."""
        parts = {
            name: SlotStore.of(self.recomputed(attention, part.view()))
            for name, part in memory.parts.items()
            if isinstance(part, SlotStore)
        }
        return memory.replace(**parts)

    def recomputed(self, attention: MemoryAttention, slots: Slots) -> Slots:
        """``slots`` with keys, values and spans (where stored) computed from their h_i with the
        current weights."""
        return self.cached(attention, slots.hidden, slots.position, slots.span is not None)

    def cached(
        self, attention: MemoryAttention, hidden: Tensor, position: Tensor, with_span: bool
    ) -> Slots:
        """The memories ``hidden`` (B, N, dim) at ``position`` (B, N) with the keys, values and
        (``with_span``) spans that a store caches, computed with the current weights."""
        keys, values = attention.key_value(hidden)
        return Slots(hidden, keys, values, position, self.span(hidden) if with_span else None)

    def alive(self, slots: Slots, time: int, begin: Tensor) -> Tensor:
        """Which memories a query at ``time`` in an episode begun at ``begin`` (B,) can see."""
        m = self.mask((slots.position - time).to(slots.hidden.dtype), slots.span, None)
        if m.dim() == 4:  # per-head masks: a memory lives while any head sees it
            m = m.amax(1)
        return (m[:, 0] > 0) & (slots.position >= begin[:, None])

    def step_memory(
        self, attention: MemoryAttention, x: Tensor, call: Call
    ) -> tuple[Tensor, Slots]:
        """The query (B, H, 1, head_dim) of a step without gradients and the memory it writes,
        ``x`` (B, dim) with its key, value, position and span (where stored) in a step's
        shapes (`memory.store.STEP_SLOT`)."""
        query, key, value = attention.project_step(x)
        return query, Slots(x, key, value, call.positions, self.span(x))

    def written(self, attention: MemoryAttention, x: Tensor, call: Call) -> tuple[Tensor, Slots]:
        """The queries of the call's steps and the memories they write, ``x`` (B, Q, dim) with
        their keys, values and spans (where stored)."""
        queries, keys, values = attention.project(x)
        return queries, Slots(x, keys, values, call.positions, self.span(x))

    def extend_recent(
        self, attention: MemoryAttention, memory: LayerMemory, x: Tensor, call: Call
    ) -> tuple[Tensor, Slots, SlotStore]:
        """The queries of the call's steps, the memories of the ``recent`` store followed by
        theirs (``x``, (B, Q, dim)) as the call's keys see them, and the store (written in
        place in step mode without gradients)."""
        store = memory["recent"]
        if call.recompute:  # one projection of every memory and step, with the live weights,
            # so that gradients reach W_k, W_v and the span predictor through them all
            old = store.view()
            hidden = torch.cat([old.hidden, x], 1)
            queries, keys, values = attention.project(hidden)
            position = torch.cat([old.position, call.positions], 1)
            span = self.span(hidden) if self.stores_span else None
            return queries[:, :, old.length :], Slots(hidden, keys, values, position, span), store
        queries, new = self.written(attention, x, call)
        slots, store = self.extend(attention, memory, "recent", new, call, self.alive)
        return queries, slots, store

    def extend(
        self,
        attention: MemoryAttention,
        memory: LayerMemory,
        part: str,
        new: Slots,
        call: Call,
        alive: Alive,
    ) -> tuple[Slots, SlotStore]:
        """The memories of store ``part`` followed by ``new``, as the call's keys see them,
        and the store (written in place in step mode without gradients)."""
        store = memory[part]
        if call.in_place:
            begin = call.query_begin[:, 0]
            store = store.with_room(new.length, lambda slots: alive(slots, call.start, begin))
            store = store.appended(new)
            return store.view(), store
        old = store.view()
        if call.recompute:  # so gradients reach W_k, W_v and the span predictor through them
            old = self.recomputed(attention, old)
        return old.cat(new), store

    def delete(self, slots: Slots, call: Call, alive: Alive) -> SlotStore:
        """Block mode: keep only the memories the next call's first query can still see; in a
        call of fixed shapes, all the slots, those of the memories it cannot see emptied
        (`MemoryState.compacted` deletes them)."""
        slots = slots.detach()
        alive = alive(slots, call.next_time, call.next_begin)
        if call.fixed_shapes:
            return SlotStore(
                slots._replace(position=slots.position.masked_fill(~alive, EMPTY)), slots.length
            )
        return SlotStore.of(slots.survivors(alive))

    def window_of(self, position: Tensor, call: Call) -> tuple[int, Tensor | None]:
        """The keys that can get a position term (A.1): the last ``block_len - 1`` memories
        before the call and the call's own steps. Memories are sorted by time, so no older
        one can be closer than block_len to a query. Where they are consecutive
        (``consecutive``), their terms are found by position, else by each one's distance."""
        width = min(position.shape[1], self.window + call.num_queries)
        if self.consecutive and call.num_queries > 1:
            return width, None  # (invisible keys may hold anything)
        return width, call.start - position[:, position.shape[1] - width :]
