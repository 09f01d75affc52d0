"""Evaluating a trained agent: episodes on seeds training never used, their outcome, and for
memory transformers the spans they give (mode=eval, a finished run's eval.json); recording
one episode."""

from __future__ import annotations

import math
from pathlib import Path

import imageio
import numpy as np
import torch
from omegaconf import DictConfig

from agents.actor_critic import ActorCritic
from agents.encoders import map_observation
from agents.episodes import EpisodeStats, after_step, episode_info, resets_next_step, to_device
from analysis.probes import SpanProbe, keep_new_memories, success_by_case, success_by_length
from envs.registry import make_env, make_vector_env, named_env
from memory import MemoryTransformer
from training.seeding import eval_seed


def evaluate_agent(
    agent: ActorCritic, env_cfg: DictConfig, eval_cfg: DictConfig, seed: int
) -> dict:
    """The outcome of `eval_cfg.episodes` episodes: success or return, memory size and, for
    memory transformers, the span probes; on the Corridor also success by length and case."""
    agent.eval()
    vec_env = make_vector_env(env_cfg, eval_cfg.num_envs)
    corridor = env_cfg.name == "corridor"
    probe = None
    if isinstance(agent.core, MemoryTransformer):
        probe = SpanProbe(agent.core, age_bin=math.ceil(agent.core.cfg.max_span / 10))
    single = make_env(env_cfg)
    word_window = named_env(env_cfg.name).word_window
    vocab = single.get_wrapper_attr("vocab") if word_window else ()
    colors = single.unwrapped.core.cell_kinds.colors if corridor else ()
    single.close()
    probe_word = vocab.index(eval_cfg.probe_word) if eval_cfg.probe_word in vocab else None

    device = next(agent.parameters()).device
    next_step = resets_next_step(vec_env)
    obs, _ = vec_env.reset(seed=eval_seed(seed))  # layouts that training never started from
    obs = to_device(obs, device)
    episode_start = torch.ones(eval_cfg.num_envs, dtype=torch.bool, device=device)
    resetting = np.zeros(eval_cfg.num_envs, dtype=bool)
    previous = None
    state = agent.initial_state(eval_cfg.num_envs, device)
    layout = ("cue_color", "good_door_north")  # the Corridor's case, not averaged below
    extra = ("corridor_length", *layout) if corridor else ()
    stats = EpisodeStats(eval_cfg.num_envs, env_cfg.name, extra)
    memory_sizes = []
    # Every environment plays its share of the episodes, so that exactly eval.episodes are
    # counted and short episodes are not favoured (as stopping at the first N to end would).
    remaining = np.array(
        [(eval_cfg.episodes + i) // eval_cfg.num_envs for i in range(eval_cfg.num_envs)]
    )
    while remaining.any():
        action, _, _, out = agent.act(obs, state, episode_start, previous, eval_cfg.greedy)
        state = out.state
        memory_sizes.append(out.memory_size)
        if probe is not None:  # the memories written at this step saw `obs`
            in_view = None if probe_word is None else obs.flatten(1, -2)[..., probe_word] != 0
            in_view = None if in_view is None else in_view.any(1)
            probe.observe(out, in_view)
            if eval_cfg.keep_marked and in_view is not None:
                keep_new_memories(state, in_view, agent.core.cfg.max_span)
        next_obs, reward, terminated, truncated, info = vec_env.step(action.cpu().numpy())
        done = terminated | truncated
        kept = remaining > 0
        stats.record(reward, done, episode_info(info, next_step), ~resetting, kept)
        remaining -= done & kept
        obs = to_device(next_obs, device)
        starting, resetting = after_step(done, resetting, next_step)
        episode_start = torch.as_tensor(starting, device=device)
        previous = (action, torch.as_tensor(reward, dtype=torch.float32, device=device))
    vec_env.close()
    finished = stats.finished  # (summary() forgets them)
    result = {  # (an outcome the env never reported is left out)
        key: value
        for key, value in stats.summary().items()
        if key not in layout and not math.isnan(value)
    }
    result["memory_size"] = float(np.mean(memory_sizes))
    if corridor:
        result["success_by_length"] = success_by_length(
            finished["corridor_length"],
            finished["success"],
            env_cfg.min_length,
            env_cfg.max_length,
            eval_cfg.length_bins,
        )
        result["success_by_case"] = success_by_case(
            finished["cue_color"], finished["good_door_north"], finished["success"], colors
        )
    if probe is not None:
        result["spans"] = probe.summary()
        result["spans"]["marked_by"] = eval_cfg.probe_word if probe_word is not None else None
        result["spans"]["marked_kept"] = bool(eval_cfg.keep_marked)
    return result


def record_episode(
    agent: ActorCritic, env_cfg: DictConfig, path: Path, seed: int, greedy: bool
) -> str:
    """Plays one episode in a single environment and writes its frames to `path`: a .gif or
    .mp4 of rgb frames, or a .txt of ansi frames."""
    suffix = path.suffix.lower()
    env = make_env(env_cfg, render_mode="ansi" if suffix == ".txt" else "rgb_array")
    obs, _ = env.reset(seed=eval_seed(seed))
    state = agent.initial_state(1)
    episode_start, previous = torch.ones(1, dtype=torch.bool), None
    frames, done = [env.render()], False
    while not done:
        batch = map_observation(lambda x: torch.as_tensor(x)[None], obs)
        action, _, _, out = agent.act(batch, state, episode_start, previous, greedy)
        state, episode_start = out.state, torch.zeros(1, dtype=torch.bool)
        obs, reward, terminated, truncated, _ = env.step(action[0].tolist())
        previous = (action, torch.tensor([reward], dtype=torch.float32))
        frames.append(env.render())
        done = terminated or truncated
    env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".txt":
        path.write_text("\n\n".join(frames))
    else:
        imageio.mimsave(path, frames, **({"duration": 0.15} if suffix == ".gif" else {"fps": 8}))
    return str(path)
