"""Evaluating a trained agent: episodes on seeds training never used, acting by its most likely
action (greedy) and by sampling as training does, their outcome and how the agent acts
(episode lengths against the shortest path, moves into walls), and for memory transformers the
spans they give (mode=eval, a finished run's eval.json); recording one episode."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import torch
from omegaconf import DictConfig

from agents.actor_critic import ActorCritic
from agents.distributions import sample
from agents.episodes import EpisodeStats
from agents.play import Player
from agents.probes import SpanProbe, keep_new_memories, success_by_case, success_by_length
from envs.registry import make_env, make_vector_env, named_env
from memory import MemoryTransformer
from training.seeding import env_seeds

# eval.policy: which policies an evaluation acts by (both: each on the same episodes' seeds)
POLICIES = {"both": ("greedy", "sampled"), "greedy": ("greedy",), "sampled": ("sampled",)}


def evaluate_policies(
    agent: ActorCritic, env_cfg: DictConfig, eval_cfg: DictConfig, seed: int
) -> dict[str, dict]:
    """{policy: `evaluate_agent`'s outcome} for each policy of ``eval_cfg.policy``: the greedy
    policy shows what the agent has decided, the sampled one what training measured. The
    sampled actions come from torch's generator seeded with ``seed`` (the caller's own stream
    left as it was), so an evaluation of one agent and seed gives the same outcome every time."""
    device = next(agent.parameters()).device
    outcomes = {}
    for policy in POLICIES[eval_cfg.policy]:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            outcomes[policy] = evaluate_agent(agent, env_cfg, eval_cfg, seed, policy == "greedy")
    return outcomes


def evaluate_agent(
    agent: ActorCritic, env_cfg: DictConfig, eval_cfg: DictConfig, seed: int, greedy: bool
) -> dict:
    """The outcome of `eval_cfg.episodes` episodes acting by the most likely action (``greedy``)
    or by sampling: success or return, episode length, the share cut by the step limit
    (`truncated`), memory size and, for memory transformers, the span probes; on MazeBase
    games the share of steps whose most likely action is a move the game blocks
    (`blocked_likely`: an argmax into a wall, which a greedy agent repeats until the step limit);
    on the Corridor also `length_ratio`, the mean episode length over the mean corridor length
    (an episode's shortest path: the corridor's cells to its east end, then the door), and
    success by length and case."""
    agent.eval()
    vec_env = make_vector_env(env_cfg, eval_cfg.num_envs)
    blocked_moves = getattr(getattr(vec_env.unwrapped, "core", None), "blocked_moves", None)
    blocked_likely, acted = 0, 0
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

    layout = ("cue_color", "good_door_north")  # the Corridor's case, not averaged below
    extra = ("corridor_length", *layout) if corridor else ()
    stats = EpisodeStats(eval_cfg.num_envs, env_cfg.name, extra)
    player = Player(vec_env, agent, stats)
    player.reset(env_seeds(seed, 0, eval_cfg.num_envs, "eval"))  # streams training never drew
    memory_sizes = []
    # Every environment plays its share of the episodes, so that exactly eval.episodes are
    # counted and short episodes are not favoured (as stopping at the first N to end would).
    remaining = np.array(
        [(eval_cfg.episodes + i) // eval_cfg.num_envs for i in range(eval_cfg.num_envs)]
    )
    while remaining.any():
        kept = remaining > 0
        blocked = None if blocked_moves is None else blocked_moves()  # (B, actions), before
        step = player.step(agent, greedy, kept)
        memory_sizes.append(float(step.out.memory_size))
        if blocked is not None:
            likely = step.action if greedy else sample(agent.policy(step.out.hidden), None)[0]
            acting = step.counted & kept
            blocked_likely += int(
                blocked[np.arange(len(acting)), likely.cpu().numpy()][acting].sum()
            )
            acted += int(acting.sum())
        if probe is not None:  # the memories written at this step saw `step.obs`
            in_view = None
            if probe_word is not None:
                in_view = (step.obs.flatten(1, -2)[..., probe_word] != 0).any(1)
            probe.observe(step.out, in_view)
            if eval_cfg.keep_marked and in_view is not None:
                keep_new_memories(player.state, in_view, agent.core.cfg.max_span)
        remaining -= (step.terminated | step.truncated) & kept
    vec_env.close()
    finished = stats.finished  # (summary() forgets them)
    result = {  # (an outcome the env never reported is left out)
        key: value
        for key, value in stats.summary().items()
        if key not in layout and not math.isnan(value)
    }
    result["memory_size"] = float(np.mean(memory_sizes))
    if blocked_moves is not None:
        result["blocked_likely"] = blocked_likely / max(acted, 1)
    if corridor:
        result["length_ratio"] = result["episode_length"] / result["corridor_length"]
        result["success_by_length"] = success_by_length(
            finished["corridor_length"],
            finished["success"],
            env_cfg.min_length,
            env_cfg.max_length,
            eval_cfg.length_bins,
        )
        result["success_by_case"] = success_by_case(
            finished["cue_color"],
            finished["good_door_north"],
            finished["success"],
            finished["truncated"],
            colors,
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
    render_mode = "ansi" if suffix == ".txt" else "rgb_array"
    # Reset in the next step, so that the episode's last frame is still there to render.
    vec_env = gym.vector.SyncVectorEnv(
        [lambda: make_env(env_cfg, render_mode=render_mode)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    player = Player(vec_env, agent, EpisodeStats(1, env_cfg.name))
    player.reset(env_seeds(seed, 0, 1, "record"))
    frames, done = [vec_env.render()[0]], False
    while not done:
        step = player.step(agent, greedy)
        frames.append(vec_env.render()[0])
        done = bool(step.terminated[0] or step.truncated[0])
    vec_env.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".txt":
        path.write_text("\n\n".join(frames))
    else:
        imageio.mimsave(path, frames, **({"duration": 0.15} if suffix == ".gif" else {"fps": 8}))
    return str(path)
