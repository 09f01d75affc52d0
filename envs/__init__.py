"""MazeBase-style grid worlds of the Expire-Span paper and a word-window view of MiniGrid.

`import envs` registers `MazeBase/Corridor-v0` and `MazeBase/Portal-v0`:

    gymnasium.make("MazeBase/Corridor-v0", max_length=50)
    gymnasium.make_vec("MazeBase/Portal-v0", num_envs=1024, vectorization_mode="vector_entry_point",
                       autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)

MiniGrid's memory tasks get the same kind of observation and actions through
`MiniGridMemoryWrapper`, `make_minigrid_memory` and `make_minigrid_memory_vec` (MiniGrid is
imported only when one of them is used).
"""

from typing import Any

import gymnasium

from envs.corridor import CorridorCore, CorridorEnv, CorridorVectorEnv
from envs.mazebase import ACTION_NAMES, COLORS, MazeBaseCore, MazeBaseEnv
from envs.portal import PORTAL_COLORS, PortalCore, PortalEnv, PortalVectorEnv
from envs.vector import MazeBaseVectorEnv
from envs.words import WordWindow

__all__ = [
    "ACTION_NAMES",
    "COLORS",
    "PORTAL_COLORS",
    "CorridorCore",
    "CorridorEnv",
    "CorridorVectorEnv",
    "MazeBaseCore",
    "MazeBaseEnv",
    "MazeBaseVectorEnv",
    "MiniGridMemoryWrapper",
    "PortalCore",
    "PortalEnv",
    "PortalVectorEnv",
    "WordWindow",
    "make_minigrid_memory",
    "make_minigrid_memory_vec",
]

gymnasium.register(
    id="MazeBase/Corridor-v0",
    entry_point="envs.corridor:CorridorEnv",
    vector_entry_point="envs.corridor:CorridorVectorEnv",
)
gymnasium.register(
    id="MazeBase/Portal-v0",
    entry_point="envs.portal:PortalEnv",
    vector_entry_point="envs.portal:PortalVectorEnv",
)

_MINIGRID_NAMES = ("MiniGridMemoryWrapper", "make_minigrid_memory", "make_minigrid_memory_vec")


def __getattr__(name: str) -> Any:
    # MiniGrid (and the networkx it imports) loads only for those who use its wrapper.
    if name in _MINIGRID_NAMES:
        from envs import minigrid_memory

        return getattr(minigrid_memory, name)
    raise AttributeError(f"module 'envs' has no attribute {name!r}")
