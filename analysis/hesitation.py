"""Where a Corridor agent hesitates: its policy by place, by steps spent there and by case.

    python -m analysis.hesitation CHECKPOINT [--episodes N] [--greedy] [--seed S] [--json]

A held Corridor policy can succeed when sampled and still split its probability between the
move it needs and a move the corridor blocks, which costs only the discount: acting greedily
it repeats the blocked move until the step limit. This plays episodes (sampled actions unless
--greedy, on evaluation's seeds) and prints, per place (the start cell beside the cue, the cells
between, the east end before the doors), per steps already spent in the cell (0: just arrived; the
last row counts all from DWELL_CAP on) and at the east end per case (cue colour, side of the
good door), the mean probability of each action and the share of steps whose most likely
action is blocked: where the policy is undecided, and whether waiting changes it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from omegaconf import OmegaConf

from agents.actor_critic import ActorCritic
from agents.build import build_agent
from agents.episodes import EpisodeStats
from agents.play import Player
from analysis.runs import RL, require_run_kind
from envs.corridor import PLACES
from envs.mazebase import ACTION_NAMES
from envs.registry import env_spaces, make_vector_env
from training.checkpoint import load_trained
from training.config import exit_on_config_error
from training.seeding import env_seeds

DWELL_CAP = 5  # steps spent in one place from which the rows are pooled


@dataclass
class Row:
    """The steps taken in one place, after one dwell, in one case."""

    steps: int = 0
    probabilities: np.ndarray = field(default_factory=lambda: np.zeros(len(ACTION_NAMES)))
    blocked_likely: int = 0


def hesitation(
    agent: ActorCritic, env_cfg, episodes: int, greedy: bool, seed: int, num_envs: int = 16
) -> list[dict]:
    """The rows the module prints, for ``episodes`` Corridor episodes of ``agent``."""
    agent.eval()
    vec_env = make_vector_env(env_cfg, num_envs)
    core = vec_env.unwrapped.core
    colors = core.cell_kinds.colors
    player = Player(vec_env, agent, EpisodeStats(num_envs, env_cfg.name))
    player.reset(env_seeds(seed, 0, num_envs, "eval"))
    rows: dict[tuple[str, int, str], Row] = {}
    dwell, last_position = np.zeros(num_envs, dtype=int), np.full(num_envs, -1)
    finished = 0
    with torch.no_grad():
        while finished < episodes:
            place, blocked = core.places(), core.blocked_moves()
            position = core.position.copy()  # where the agent acts from
            dwell = np.where(position == last_position, dwell + 1, 0)
            cases = [
                f"{colors[c]} cue, door {'north' if n else 'south'}" if p == 2 else ""
                for c, n, p in zip(core.cue_color, core.good_door_north, place, strict=True)
            ]
            step = player.step(agent, greedy)
            probabilities = torch.softmax(agent.policy(step.out.hidden), -1).cpu().numpy()
            for i in np.flatnonzero(step.counted):
                key = (PLACES[place[i]], min(dwell[i], DWELL_CAP), cases[i])
                row = rows.setdefault(key, Row())
                row.steps += 1
                row.probabilities += probabilities[i]
                row.blocked_likely += int(blocked[i, probabilities[i].argmax()])
            ended = step.terminated | step.truncated
            last_position = np.where(ended, -1, position)
            finished += int(ended.sum())
    vec_env.close()
    return [
        {
            "place": place,
            "dwell": f"{k}+" if k == DWELL_CAP else str(k),
            "case": case,
            "steps": row.steps,
            **dict(zip(ACTION_NAMES, (row.probabilities / row.steps).tolist(), strict=True)),
            "blocked_likely": row.blocked_likely / row.steps,
        }
        for (place, k, case), row in sorted(
            rows.items(), key=lambda r: (PLACES.index(r[0][0]), r[0][2], r[0][1])
        )
    ]


def markdown(rows: Sequence[dict]) -> str:
    header = ["place", "case", "steps there", "steps", *ACTION_NAMES, "argmax blocked"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["place"], row["case"] or "-", row["dwell"], str(row["steps"])]
        cells += [f"{row[name]:.3f}" for name in ACTION_NAMES] + [f"{row['blocked_likely']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.hesitation", description=__doc__.split("\n")[0]
    )
    parser.add_argument("checkpoint", help="a train_rl.py checkpoint file or run directory")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--greedy", action="store_true", help="act by the most likely action")
    parser.add_argument("--seed", type=int, default=0, help="evaluation's seed")
    parser.add_argument("--json", action="store_true", help="one JSON line per row instead")
    args = parser.parse_args(argv)
    checkpoint = load_trained(args.checkpoint, "agent", other="train_lm.py")
    require_run_kind(parser.prog, args.checkpoint, checkpoint["config"], RL)
    cfg = OmegaConf.create(checkpoint["config"])
    if cfg.env.name != "corridor":
        parser.error(f"{args.checkpoint} is an env={cfg.env.name} agent; this reads the Corridor")
    agent = build_agent(cfg, *env_spaces(cfg.env))
    agent.load_state_dict(checkpoint["agent"])
    torch.manual_seed(args.seed)
    rows = hesitation(agent, cfg.env, args.episodes, args.greedy, args.seed)
    print("\n".join(json.dumps(row) for row in rows) if args.json else markdown(rows))


if __name__ == "__main__":
    exit_on_config_error(main)()
