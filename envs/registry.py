"""The named envs of `train_rl.py env=NAME` (configs/env/NAME.yaml): how to make each, single
and batched, what its episodes report, and the metrics it is judged by. The trainer, the
analysis tools and the benchmarks read it; a new named env is its module, one entry here and
its config file.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode
from omegaconf import OmegaConf

SAME_STEP = {"autoreset_mode": AutoresetMode.SAME_STEP}
# env config fields that are not the env's keyword arguments: its name and id, and the agent's
# inputs set beside them (agents.build)
AGENT_INPUT_KEYS = ("previous_action", "previous_reward", "normalise_observations")
META_KEYS = ("name", "id", *AGENT_INPUT_KEYS)


@dataclass(frozen=True)
class NamedEnv:
    """What the project knows of one env config."""

    name: str
    outcomes: tuple[str, ...]  # what its episodes report at their end, besides return, length
    metric: str | None  # the task metric (best.pt, the anchor's anchor_from, analysis.curves);
    # None: `success` if the env reports it, else the return
    score: str  # a run's score, one point per run (analysis.plot): mmer is the best return
    any_gym_id: bool = False  # takes any Gymnasium id (env.id, env.kwargs, env.vectorization)
    step_limit_ends_episode: bool = False  # the paper's tasks: no bootstrap at the step limit
    word_window: bool = True  # a MazeBase-style window of words (a vocabulary, probe words)


NAMED_ENVS = {
    env.name: env
    for env in (
        NamedEnv("corridor", ("success",), "success", "success", step_limit_ends_episode=True),
        NamedEnv(
            "portal",
            ("success", "rooms_reached"),
            "rooms_reached",
            "rooms_reached",
            step_limit_ends_episode=True,
        ),
        NamedEnv("minigrid_memory", ("success",), "success", "success"),
        NamedEnv("gym", ("success",), None, "mmer", any_gym_id=True, word_window=False),
        NamedEnv("popgym", (), "return", "mmer", any_gym_id=True, word_window=False),
    )
}
INFO_KEYS = {"success": ("success", "is_success")}  # the names envs give an outcome in `info`


def named_env(name: str) -> NamedEnv:
    """The registry's entry for env config `name`; ValueError naming the known ones."""
    if name not in NAMED_ENVS:
        raise ValueError(f"env={name} is not a named env; choose one of: {', '.join(NAMED_ENVS)}")
    return NAMED_ENVS[name]


def task_metric(env_name: str, records: Sequence[Mapping[str, Any]]) -> str:
    """The task metric of a run of ``env_name`` that logged ``records``: the env's own, else
    `success` if the env reports it (a Gymnasium env's `success` or `is_success`), else the
    episode return."""
    metric = named_env(env_name).metric
    if metric is not None:
        return metric
    reported = (r.get("success") for r in records)
    return "success" if any(v is not None and not math.isnan(v) for v in reported) else "return"


def env_kwargs(env_cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The env's keyword arguments: for envs that take any Gymnasium id, `env.kwargs` and the
    step limit; for the project's own envs, the env fields other than `META_KEYS`."""
    if OmegaConf.is_config(env_cfg):
        env_cfg = OmegaConf.to_container(env_cfg, resolve=True)
    if not named_env(env_cfg["name"]).any_gym_id:
        return {k: v for k, v in env_cfg.items() if k not in META_KEYS and v is not None}
    kwargs = dict(env_cfg["kwargs"])
    if env_cfg["max_episode_steps"] is not None:
        kwargs["max_episode_steps"] = env_cfg["max_episode_steps"]
    return kwargs


def env_spec(env_id: str) -> gym.envs.registration.EnvSpec:
    """The registration of ``env_id``; a `module:Id` id imports the module first, as
    `gymnasium.make` does."""
    module, _, name = env_id.rpartition(":")
    if module:
        importlib.import_module(module)
    return gym.spec(name)


def env_spaces(env_cfg: Mapping[str, Any]) -> tuple[gym.Space, gym.Space]:
    """The observation and action spaces of the env config ``env_cfg`` (an agent's shape)."""
    env = make_env(env_cfg)
    env.close()
    return env.observation_space, env.action_space


def make_env(env_cfg: Mapping[str, Any], render_mode: str | None = None) -> gym.Env:
    """One environment of the env config ``env_cfg``."""
    kwargs = env_kwargs(env_cfg)
    if render_mode is not None:  # (envs that never render, as POPGym's, do not take it)
        kwargs["render_mode"] = render_mode
    if env_cfg["name"] == "minigrid_memory":
        from envs.minigrid_memory import make_minigrid_memory  # (MiniGrid loads only here)

        return make_minigrid_memory(env_cfg["id"], **kwargs)
    return gym.make(env_cfg["id"], **kwargs)


def make_vector_env(env_cfg: Mapping[str, Any], num_envs: int) -> gym.vector.VectorEnv:
    """The batched environments of ``env_cfg``, autoresetting in the same step where they can:
    the env's own batched implementation (its vector entry point) when it has one, else
    Gymnasium's sync or async vector env (`env.vectorization`)."""
    kwargs = env_kwargs(env_cfg)
    if env_cfg["name"] == "minigrid_memory":
        from envs.minigrid_memory import make_minigrid_memory_vec

        return make_minigrid_memory_vec(env_cfg["id"], num_envs, **SAME_STEP, **kwargs)
    mode = env_cfg.get("vectorization", "auto")
    entry_point = env_spec(env_cfg["id"]).vector_entry_point
    if mode == "auto":
        mode = "vector_entry_point" if entry_point else "sync"
    if mode == "vector_entry_point" and takes_keyword(entry_point, "autoreset_mode"):
        kwargs.update(SAME_STEP)  # (else it resets as it does: `resets_next_step`)
    return gym.make_vec(
        env_cfg["id"],
        num_envs=num_envs,
        vectorization_mode=mode,
        vector_kwargs=None if mode == "vector_entry_point" else SAME_STEP,
        **kwargs,
    )


def takes_keyword(entry_point: str | Any, name: str) -> bool:
    """Whether an env's entry point (a callable or a "module:attr" string) takes keyword
    argument ``name``."""
    if isinstance(entry_point, str):
        entry_point = gym.envs.registration.load_env_creator(entry_point)
    parameters = inspect.signature(entry_point).parameters.values()
    return any(p.name == name or p.kind is p.VAR_KEYWORD for p in parameters)
