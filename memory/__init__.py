"""Attention memories that learn what to forget, and the transformer core built on them.

Shared by the RL agents and the language models::

    from memory import MemoryConfig, MemoryTransformer

    core = MemoryTransformer(MemoryConfig(kind="expire_span", max_span=200))
    state = core.initial_state(batch_size)
    out = core(x, state, episode_start)  # block mode: x (B, K, dim), episode_start (B, K)
    out = core.step(x_t, out.state, episode_start_t)  # step mode: x_t (B, dim)
    out.hidden, out.state, out.aux_loss, out.memory_size

Kinds (``MemoryConfig.kind``), each a module of the same name that keeps its own state
(docs/memory-kinds.md says how to add one):

- ``transformer_xl``: a fixed span, the last L hidden states.
- ``expire_span``: span predictor (eq. 3 / 8), soft mask (eq. 5), auxiliary loss on the
  ramp (eq. 7, section 4.2), random memory shortening (4.2), small initial spans (A.1).
- ``adaptive_span``: a learned span per head with the ramp mask.
- ``compressive``: mean-pool compression of evicted memories.

Shared pieces: ``attention`` (renormalised attention, eq. 4, and relative positions for the
last block only, A.1), ``kind`` (visibility, masks, deletion; the registry of kinds),
``store`` (the memory layout and its deletion by compaction), ``state`` (the core's state
made of stores; ``MemoryState`` and ``LayerMemory`` document it), ``transformer``.

Step mode and block mode agree to float error: every mask and position term depends only
on the distance t - i and on episode boundaries, never on how the steps were grouped.
"""

from memory.config import MemoryConfig
from memory.kind import MemoryKind, kind_classes, kind_names
from memory.state import LayerMemory, MemoryState
from memory.store import Slots, SlotStore
from memory.transformer import CoreOutput, MemoryLayer, MemoryTransformer

__all__ = [
    "CoreOutput",
    "LayerMemory",
    "MemoryConfig",
    "MemoryKind",
    "MemoryLayer",
    "MemoryState",
    "MemoryTransformer",
    "SlotStore",
    "Slots",
    "kind_classes",
    "kind_names",
]
