"""Pictures of MazeBase maps: text with a legend ("ansi") and an RGB image ("rgb_array").

In the image, floor is dark, blocks grey, a cue a coloured disc, a door a coloured tile with a
dark frame and knob, and the agent a white disc.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from envs.mazebase import MazeBaseCells

FLOOR = (30, 30, 34)
GRID_LINE = (52, 52, 58)
BLOCK = (128, 128, 128)
BLOCK_EDGE = (92, 92, 92)
DARK = (15, 15, 15)
AGENT = (255, 255, 255)
REACHED = (110, 110, 110)


def text_picture(
    codes: np.ndarray, agent: tuple[int, int], cells: MazeBaseCells, caption: str
) -> str:
    """One character per cell (north at the top), the agent as `@`, then the legend."""
    letters = cells.letters[codes]
    letters[agent] = "@"
    return "\n".join([caption, *("".join(row) for row in letters), cells.legend]) + "\n"


def rgb_picture(
    codes: np.ndarray,
    agent: tuple[int, int],
    cells: MazeBaseCells,
    pixels: int,
    canvas_shape: tuple[int, int],
) -> np.ndarray:
    """The map drawn at `pixels` per cell on a canvas of `canvas_shape` cells (blocks beyond
    the map), so that every frame of a game has the same size."""
    canvas = np.full(canvas_shape, cells.BLOCK, dtype=codes.dtype)
    canvas[: codes.shape[0], : codes.shape[1]] = codes
    tiles = cell_tiles(cells, pixels)[canvas]  # (rows, cols, pixels, pixels, 3)
    radius = _radius(pixels)
    agent_tile = tiles[agent]
    agent_tile[radius < 0.36] = DARK
    agent_tile[radius < 0.28] = AGENT
    rows, cols = canvas_shape
    return tiles.transpose(0, 2, 1, 3, 4).reshape(rows * pixels, cols * pixels, 3)


def cell_tiles(cells: MazeBaseCells, pixels: int) -> np.ndarray:
    """One `pixels` x `pixels` RGB tile per cell code."""
    y, x = np.mgrid[:pixels, :pixels] + 0.5
    near_side = np.minimum(np.minimum(x, y), pixels - np.maximum(x, y))
    radius = _radius(pixels)
    knob = (abs(x / pixels - 0.75) < 0.08) & (abs(y / pixels - 0.5) < 0.08)
    tiles = np.empty((len(cells.kinds), pixels, pixels, 3), dtype=np.uint8)
    for tile, (name, _), rgb in zip(tiles, cells.kinds, cells.rgb, strict=True):
        tile[:] = FLOOR
        tile[near_side < 1] = GRID_LINE
        if name == "block":
            tile[:] = BLOCK
            tile[near_side < 1] = BLOCK_EDGE
        elif name == "cue":
            tile[radius < 0.32] = rgb
        elif name.endswith("door"):
            tile[:] = rgb
            tile[(near_side < pixels / 8) | knob] = DARK
    return tiles


def progress_bar(width: int, height: int, reached: float, current: float) -> np.ndarray:
    """A strip to put under a frame: grey up to the fraction `reached`, a white tick at the
    fraction `current`."""
    bar = np.empty((height, width, 3), dtype=np.uint8)
    bar[:] = FLOOR
    bar[2:-2, : round(reached * width)] = REACHED
    tick = min(int(current * width), width - 1)
    bar[:, max(tick - 1, 0) : tick + 2] = AGENT
    return bar


def _radius(pixels: int) -> np.ndarray:
    """Distance of each pixel's centre from the tile's centre, in tiles."""
    y, x = np.mgrid[:pixels, :pixels] + 0.5
    return np.hypot(x - pixels / 2, y - pixels / 2) / pixels
