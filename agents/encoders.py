"""Observation encoders, one small module per kind of Gymnasium space, chosen by `make_encoder`.

Every encoder maps observations with any leading dimensions, (B,) while acting or (B, T) in
block mode, to vectors (..., dim). Observations of Tuple and Dict spaces are tuples and dicts
of tensors; `map_observation` applies a function to each of their tensors (to allocate,
fill and index the observation buffer of an unroll).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from memory.linear import Linear

IMAGE_MIN_SIZE = 8  # an (H, W, C) uint8 Box with H, W >= 8 and pixel values above 1 is an image
NORMALISE = ("auto", True, False)  # env.normalise_observations: auto = where a Box is unbounded
# The spaces with an encoder of their own; Tuple and Dict spaces of them have `CompositeEncoder`.
ENCODED_SPACES = spaces.Box | spaces.MultiBinary | spaces.Discrete | spaces.MultiDiscrete


def map_observation(fn: Callable[..., Any], *observations: Any) -> Any:
    """``fn`` applied to the matching tensors (or arrays) of ``observations``, keeping their
    structure: a tensor, a tuple (Tuple spaces) or a dict (Dict spaces), nested or not."""
    first = observations[0]
    if isinstance(first, dict):
        return {key: map_observation(fn, *(obs[key] for obs in observations)) for key in first}
    if isinstance(first, tuple | list):
        return tuple(map_observation(fn, *parts) for parts in zip(*observations, strict=True))
    return fn(*observations)


def is_image(space: spaces.Space) -> bool:
    """An (H, W, C) uint8 Box of pixels. A multi-hot window of words (values 0 and 1, as the
    MazeBase and MiniGrid word windows) is not an image, whatever its size."""
    return (
        isinstance(space, spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and min(space.shape[:2]) >= IMAGE_MIN_SIZE
        and int(space.high.max()) > 1
    )


def _flatten_last(x: torch.Tensor, dims: int) -> torch.Tensor:
    """``x`` with its last ``dims`` dimensions flattened into one (a new one if ``dims`` is 0)."""
    return x.reshape(*x.shape[: x.ndim - dims], -1)


def unbounded(space: spaces.Space) -> bool:
    """A float Box with a bound that is not finite: observations of unknown scale."""
    if not isinstance(space, spaces.Box) or space.dtype.kind != "f":
        return False
    return not (np.isfinite(space.low).all() and np.isfinite(space.high).all())


class RunningNormaliser(nn.Module):
    """Features of unknown scale to about zero mean and unit variance: the mean and variance
    of every observation seen so far (merged batch by batch, Chan et al. 1979), clipped to
    +-CLIP. The statistics are buffers, saved and restored with the agent; they move only in
    `update`, between the learner's updates, so acting and learning normalise an unroll
    alike."""

    CLIP = 10.0

    def __init__(self, size: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = (self.var + 1e-8).rsqrt()
        return ((x - self.mean.to(x.dtype)) * scale.to(x.dtype)).clamp(-self.CLIP, self.CLIP)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merges the features ``x`` (..., size) into the statistics, summed over the ranks
        of a torchrun job, so every rank keeps the same."""
        x = x.reshape(-1, x.shape[-1]).double()
        moments = torch.cat([x.new_tensor([len(x)]), x.sum(0), x.square().sum(0)])
        if torch.distributed.is_initialized():
            torch.distributed.all_reduce(moments)
        count, total, squares = moments[0], *moments[1:].chunk(2)
        batch_mean = total / count
        batch_var = (squares / count - batch_mean.square()).clamp_min(0)
        merged = self.count + count
        delta = batch_mean - self.mean
        spread = self.var * self.count + batch_var * count  # the sums of squared deviations
        self.var.copy_((spread + delta.square() * self.count * count / merged) / merged)
        self.mean.add_(delta * count / merged)
        self.count.copy_(merged)


class FlatEncoder(nn.Sequential):
    """Box (any dtype and shape) and MultiBinary: flattened and cast to float, with
    ``normalise`` brought to the running statistics of a `RunningNormaliser` (else with its
    values unchanged), then Linear and ReLU. On a multi-hot word window each (cell, word) pair
    gets its own embedding, summed over the words present, as in MazeBase models."""

    def __init__(self, shape: tuple[int, ...], dim: int, normalise: bool = False) -> None:
        size = math.prod(shape)
        normaliser = [RunningNormaliser(size)] if normalise else []
        super().__init__(*normaliser, Linear(size, dim), nn.ReLU())
        self.obs_dims = len(shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return super().forward(_flatten_last(obs, self.obs_dims).float())

    def update_statistics(self, obs: torch.Tensor) -> None:
        if isinstance(self[0], RunningNormaliser):
            self[0].update(_flatten_last(obs, self.obs_dims).float())


class ImageEncoder(nn.Module):
    """(H, W, C) uint8 images: scaled to [0, 1], two strided 3x3 convolutions, Linear, ReLU."""

    def __init__(self, shape: tuple[int, int, int], dim: int) -> None:
        super().__init__()
        height, width, channels = shape
        self.conv = nn.Sequential(
            nn.Conv2d(channels, 16, 3, stride=2),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2),
            nn.ReLU(),
            nn.Flatten(),
        )
        features = self.conv(torch.zeros(1, channels, height, width)).shape[1]
        self.out = nn.Sequential(Linear(features, dim), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        images = obs.reshape(-1, *obs.shape[-3:]).permute(0, 3, 1, 2).float() / 255
        return self.out(self.conv(images)).reshape(*obs.shape[:-3], -1)


class EmbeddingEncoder(nn.Module):
    """Discrete and MultiDiscrete: an embedding per component and value, summed over the
    components (a Discrete space is one component)."""

    def __init__(self, space: spaces.Discrete | spaces.MultiDiscrete, dim: int) -> None:
        super().__init__()
        sizes = np.asarray(space.n if isinstance(space, spaces.Discrete) else space.nvec)
        sizes = sizes.reshape(-1).astype(np.int64)
        starts = np.broadcast_to(np.asarray(space.start, dtype=np.int64).reshape(-1), sizes.shape)
        # Value v of component i is row offsets[i] + v of one shared table.
        offsets = np.cumsum(sizes) - sizes - starts
        self.register_buffer("offsets", torch.as_tensor(offsets), persistent=False)
        self.embedding = nn.Embedding(int(sizes.sum()), dim)
        self.obs_dims = len(space.shape)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        components = _flatten_last(obs, self.obs_dims).long()
        return self.embedding(components + self.offsets).sum(-2)


class CompositeEncoder(nn.Module):
    """Tuple and Dict: each part's own encoder, concatenated, then a Linear to dim."""

    def __init__(
        self, space: spaces.Tuple | spaces.Dict, dim: int, normalise: bool | str = "auto"
    ) -> None:
        super().__init__()
        if isinstance(space, spaces.Dict):
            encoders = {key: make_encoder(part, dim, normalise) for key, part in space.items()}
            self.parts = nn.ModuleDict(encoders)
        else:
            self.parts = nn.ModuleList(make_encoder(part, dim, normalise) for part in space)
        self.project = Linear(len(space) * dim, dim)

    def forward(self, obs: tuple | dict) -> torch.Tensor:
        if isinstance(self.parts, nn.ModuleDict):
            encoded = [encoder(obs[key]) for key, encoder in self.parts.items()]
        else:
            encoded = [encoder(part) for encoder, part in zip(self.parts, obs, strict=True)]
        return self.project(torch.cat(encoded, dim=-1))

    def update_statistics(self, obs: tuple | dict) -> None:
        if isinstance(self.parts, nn.ModuleDict):
            for key, encoder in self.parts.items():
                update_statistics(encoder, obs[key])
        else:
            for encoder, part in zip(self.parts, obs, strict=True):
                update_statistics(encoder, part)


def update_statistics(encoder: nn.Module, obs: Any) -> None:
    """Moves the running statistics of ``encoder``'s normalisers (if any) by ``obs``."""
    if isinstance(encoder, FlatEncoder | CompositeEncoder):
        encoder.update_statistics(obs)


def check_observation_space(space: spaces.Space) -> None:
    """Raises ValueError, saying what would do, unless `make_encoder` has an encoder for
    ``space``: a Box, MultiBinary, Discrete or MultiDiscrete space, or a Tuple or Dict of them
    (nested or not)."""
    if isinstance(space, spaces.Tuple | spaces.Dict):
        parts = space.spaces.values() if isinstance(space, spaces.Dict) else space.spaces
        for part in parts:
            check_observation_space(part)
    elif not isinstance(space, ENCODED_SPACES):
        raise ValueError(
            f"no encoder for observation space {space}: use Box, MultiBinary, Discrete, "
            "MultiDiscrete, or a Tuple or Dict of them (e.g. wrap the env to drop other parts)"
        )


def make_encoder(space: spaces.Space, dim: int, normalise: bool | str = "auto") -> nn.Module:
    """The encoder of observations from ``space`` (`check_observation_space`), to vectors of
    size ``dim``. ``normalise``: whether Box observations (not images) go through running
    statistics first; "auto": those of unbounded float Boxes (`unbounded`)."""
    check_observation_space(space)
    if is_image(space):
        return ImageEncoder(space.shape, dim)
    if isinstance(space, spaces.Box | spaces.MultiBinary):
        on = unbounded(space) if normalise == "auto" else bool(normalise)
        return FlatEncoder(space.shape, dim, on and isinstance(space, spaces.Box))
    if isinstance(space, spaces.Discrete | spaces.MultiDiscrete):
        return EmbeddingEncoder(space, dim)
    return CompositeEncoder(space, dim, normalise)
