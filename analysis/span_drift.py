"""Why a memory's expire-span moves between checkpoints: its input h_i, or the predictor w, b.

    python -m analysis.span_drift RUN_DIR [--every K] [--episodes N]

An Expire-Span memory lives e_i = L sigmoid(w.h_i + b) steps (eq. 3). Between two kept
checkpoints of a run (``checkpoint_keep``) both w, b and the layer's input h_i (the output of
the layers below, trained by the policy and value losses) change. For the first memory of an
episode (t = 0, written from the first observation alone, so the same for any policy; on the
Corridor the cue is in view there), this prints one JSON line per layer, distinct first
observation and pair of consecutive checkpoints: the span before and after, the change with
only h_i moved (the predictor of the earlier checkpoint on the later h_i) and with only w, b
moved (the later predictor on the earlier h_i).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import OmegaConf

from agents.actor_critic import ActorCritic
from agents.build import build_agent
from analysis.runs import RL, require_run_kind, saved_config
from envs.registry import make_env
from memory.expire_span import SpanPredictor
from training.checkpoint import kept_checkpoints, load_checkpoint
from training.config import exit_on_config_error


def drift_split(predictors: list[SpanPredictor], hiddens: list[torch.Tensor]) -> list[dict]:
    """For each pair of consecutive checkpoints (j, j + 1), with predictors e_j(.) and the
    memories' inputs h_j (N, dim): the mean span before and after, and the change made by
    h alone, e_j(h_{j+1}) - e_j(h_j), and by the predictor alone, e_{j+1}(h_j) - e_j(h_j)."""
    rows = []
    with torch.no_grad():
        for j in range(len(predictors) - 1):
            before = predictors[j](hiddens[j]).mean().item()
            rows.append(
                {
                    "span_before": before,
                    "span_after": predictors[j + 1](hiddens[j + 1]).mean().item(),
                    "by_input": predictors[j](hiddens[j + 1]).mean().item() - before,
                    "by_predictor": predictors[j + 1](hiddens[j]).mean().item() - before,
                }
            )
    return rows


def first_memories(agent: ActorCritic, observations: torch.Tensor) -> list[torch.Tensor]:
    """Each layer's memory h_i (its normed input) of an episode's first step, (B, dim)."""
    hidden = []
    hooks = [
        layer.attention_norm.register_forward_hook(lambda m, i, out: hidden.append(out[:, 0]))
        for layer in agent.core.layers
    ]
    starts = torch.ones(len(observations), 1, dtype=torch.bool)
    with torch.no_grad():
        x = agent.encode(observations[:, None], starts)
        agent.core(x, agent.core.initial_state(len(observations)), starts)
    for hook in hooks:
        hook.remove()
    return hidden


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.span_drift", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--every", type=int, default=1, help="use every K-th kept checkpoint")
    parser.add_argument("--episodes", type=int, default=64, help="first observations drawn")
    args = parser.parse_args(argv)
    if not args.run_dir.is_dir():
        parser.error(f"{args.run_dir} is not a run directory")
    config = saved_config(args.run_dir)
    if config is not None:
        require_run_kind(parser.prog, args.run_dir, config, RL)
    found = kept_checkpoints(args.run_dir)[:: args.every]
    if len(found) < 2:
        parser.error(f"{args.run_dir}: needs two or more checkpoint_<step>.pt (checkpoint_keep)")
    agents, env = [], None
    for _, path in found:
        checkpoint = load_checkpoint(path)
        require_run_kind(parser.prog, path, checkpoint.get("config", {}), RL)
        cfg = OmegaConf.create(checkpoint["config"])
        if cfg.memory.kind != "expire_span":
            parser.error(f"{path} is a memory={cfg.memory.kind} agent; spans need expire_span")
        env = env or make_env(cfg.env)
        agent = build_agent(cfg, env.observation_space, env.action_space)
        agent.load_state_dict(checkpoint["agent"])
        agents.append(agent.eval())
    firsts = torch.stack([torch.as_tensor(env.reset(seed=s)[0]) for s in range(args.episodes)])
    groups: dict[bytes, list[int]] = {}
    for i, observation in enumerate(firsts):
        groups.setdefault(observation.numpy().tobytes(), []).append(i)
    memories = [first_memories(agent, firsts.float()) for agent in agents]
    for layer in range(len(agents[0].core.layers)):
        predictors = [agent.core.layers[layer].kind.predictor for agent in agents]
        for group, members in enumerate(groups.values()):
            index = torch.tensor(members)
            rows = drift_split(predictors, [m[layer][index] for m in memories])
            for (step, _), row in zip(found[1:], rows, strict=True):
                record = {"layer": layer, "observation": group, "episodes": len(members)}
                print(json.dumps({**record, "step": step, **row}))


if __name__ == "__main__":
    exit_on_config_error(main)()  # a damaged checkpoint: one line
