"""An agent from a run's config: the memory core (`memory.*`) inside the actor-critic, for the
env's observation and action spaces."""

from __future__ import annotations

import gymnasium as gym
from omegaconf import DictConfig, OmegaConf

from agents.actor_critic import ActorCritic
from agents.core import Core
from agents.feedforward import FEEDFORWARD_KIND, FeedForwardCore
from agents.recurrent import RECURRENT_KINDS, RecurrentCore
from memory import MemoryConfig, MemoryTransformer


def build_core(memory_cfg: DictConfig) -> Core:
    """The memory core `memory.kind` names: a memory transformer, a recurrent baseline, or
    the feed-forward core without memory."""
    fields = OmegaConf.to_container(memory_cfg, resolve=True)
    if fields["kind"] == FEEDFORWARD_KIND:
        return FeedForwardCore(fields["dim"])
    if fields["kind"] in RECURRENT_KINDS:
        return RecurrentCore(fields["dim"], fields["num_layers"], fields["kind"])
    return MemoryTransformer(MemoryConfig(**fields))


def build_agent(cfg: DictConfig, obs_space: gym.Space, action_space: gym.Space) -> ActorCritic:
    """The actor-critic of a run's config (`memory`, and the env's previous-action and
    previous-reward inputs) for these spaces."""
    agent = ActorCritic(
        obs_space,
        action_space,
        build_core(cfg.memory),
        cfg.memory.dim,
        previous_action=cfg.env.get("previous_action", False),
        previous_reward=cfg.env.get("previous_reward", False),
        normalise_observations=cfg.env.get("normalise_observations", "auto"),
    )
    if cfg.get("compile_acting", False):
        agent.compile_acting()
    return agent
