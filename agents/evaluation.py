"""Evaluating a trained agent: episodes on seeds training never used, acting by its most likely
action (greedy) and by sampling as training does, their outcome and how the agent acts
(episode lengths against the shortest path, moves into walls), and for memory transformers the
spans they give (mode=eval, a finished run's eval.json); recording one episode, with what a
memory transformer's memory keeps under every frame (eval.record)."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import imageio
import numpy as np
import torch
from omegaconf import DictConfig

from agents.actor_critic import ActorCritic
from agents.core import Core, State
from agents.distributions import sample
from agents.episodes import EpisodeStats
from agents.play import Player
from agents.probes import SpanProbe, keep_new_memories, success_by_case, success_by_length
from envs.registry import make_env, make_vector_env, named_env
from memory import MemoryTransformer
from training.seeding import env_seeds

# eval.policy: which policies an evaluation acts by (both: each on the same episodes' seeds)
GIF_FRAME_MS = 150  # how long a recorded GIF shows each step
POLICIES = {"both": ("greedy", "sampled"), "greedy": ("greedy",), "sampled": ("sampled",)}
# A recording's memory strip (`memory_strip`): a cell per step, dark while its memory is kept
STRIP_CELL, MIN_STRIP_CELL, STRIP_GAP = 16, 3, 2  # pixels (a cell's largest and least side)
STRIP_KEPT, STRIP_LOST, STRIP_BLANK = (30, 30, 34), (200, 200, 200), (255, 255, 255)


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
    .mp4 of rgb frames, or a .txt of ansi frames. A memory transformer's frames show under the
    picture which steps' memories each layer still holds for the next query
    (`memory_strip`, `memory_lines`)."""
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
    alive = [alive_memories(agent.core, player.state)]
    while not done:
        step = player.step(agent, greedy)
        frames.append(vec_env.render()[0])
        alive.append(alive_memories(agent.core, step.out.state))
        done = bool(step.terminated[0] or step.truncated[0])
    vec_env.close()
    if alive[0] is not None:
        steps = len(frames) - 1
        frames = [
            with_memory(frame, kept, steps) for frame, kept in zip(frames, alive, strict=True)
        ]
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".txt":
        path.write_text("\n\n".join(frames))
    else:
        # (imageio's pillow writer takes a GIF's duration in milliseconds; loop 0: forever)
        options = {"duration": GIF_FRAME_MS, "loop": 0} if suffix == ".gif" else {"fps": 8}
        imageio.mimsave(path, frames, **options)
    return str(path)


def alive_memories(core: Core, state: State) -> np.ndarray | None:
    """(layers, steps) bool: whether the memory each step of the current episode wrote (of the
    first environment) is alive for the next query, as the layer's kind decides which memories
    a query may still see (`MemoryKind.alive`; a compressive memory's FIFO, its compressed
    memories left out); None for a recurrent or feed-forward core, which keeps no memories."""
    if not isinstance(core, MemoryTransformer):
        return None
    begin = int(state.episode_begin[0])
    kept = np.zeros((len(core.layers), int(state.time) - begin), dtype=bool)
    for row, layer, memory in zip(kept, core.layers, state.layers, strict=True):
        slots = memory["recent"].view()  # (every kind keeps its recent memories there)
        alive = layer.kind.alive(slots, state.time, state.episode_begin)[0]
        row[(slots.position[0][alive] - begin).cpu().numpy()] = True
    return kept


def with_memory(frame: np.ndarray | str, kept: np.ndarray, steps: int) -> np.ndarray | str:
    """A frame with what the memory keeps under it (``kept``, `alive_memories`'s, of an
    episode of ``steps`` steps): `memory_strip` under an rgb frame, `memory_lines` under text."""
    if isinstance(frame, str):
        return "\n".join([frame.rstrip("\n"), *memory_lines(kept)]) + "\n"
    return np.concatenate([frame, memory_strip(kept, steps, frame.shape[1])])


def memory_lines(kept: np.ndarray) -> list[str]:
    """One line per layer, a character per step so far: `#` its memory is kept, `.` not."""
    return [
        f"layer {index} memory: {''.join('#' if cell else '.' for cell in row)}".rstrip()
        for index, row in enumerate(kept)
    ]


def strip_cells(steps: int, width: int) -> tuple[int, int]:
    """The side in pixels of a step's cell in a strip ``width`` pixels wide for an episode of
    ``steps`` steps, and the cells per line: the whole episode on one line of cells of
    `STRIP_CELL` pixels at most, wrapped onto more lines once cells would be under
    `MIN_STRIP_CELL` pixels."""
    side = max(MIN_STRIP_CELL, min(STRIP_CELL, width // max(steps, 1)))
    return side, width // side


def memory_strip(kept: np.ndarray, steps: int, width: int) -> np.ndarray:
    """What each layer keeps, ``kept`` (layers, steps so far), as an rgb strip ``width`` pixels
    wide, laid out for an episode of ``steps`` steps so that every frame's strip has one size:
    per layer (top: layer 0) a cell per step, dark where its memory is kept for the next
    query, light where it expired or was never stored; steps still to come are left blank."""
    side, per_line = strip_cells(steps, width)
    lines = -(-steps // per_line)  # (ceil)
    band = lines * side + STRIP_GAP  # a layer's lines of cells and the gap under them
    height = -(-len(kept) * band // 16) * 16  # (whole macro blocks: an mp4 is not rescaled)
    strip = np.full((height, width, 3), STRIP_BLANK, dtype=np.uint8)
    for layer, row in enumerate(kept):
        for step, cell in enumerate(row):
            line, column = divmod(step, per_line)
            top, left = layer * band + line * side, column * side
            # (a pixel of blank between cells, so that a run of cells can be counted)
            strip[top : top + side - 1, left : left + side - 1] = STRIP_KEPT if cell else STRIP_LOST
    return strip
