"""The trained agents the repository ships (`trained/`, made by scripts/trained_agents.sh):
each evaluates from the file as committed, acts as its run's evaluation said, and records."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # train_rl.py mode=eval in a subprocess
ROOT = Path(__file__).resolve().parents[1]

# What each agent's greedy evaluation must reach, below its run's own (seed 300): the default
# Corridor agent's success (docs/results.md, "Full Corridor"), the Portal agent's rooms (11.1
# over its run's 100 greedy episodes, 9.8 over these 16; a random door on every visit: 2.7).
AGENTS = {"corridor": ("success", 0.95), "portal": ("rooms_reached", 8.0)}


@pytest.mark.parametrize("env", AGENTS)
def test_a_committed_agent_evaluates_and_records(env, tmp_path):
    metric, floor = AGENTS[env]
    gif = tmp_path / "episode.gif"
    command = [
        sys.executable,
        str(ROOT / "train_rl.py"),
        "mode=eval",
        f"checkpoint={ROOT / 'trained' / f'{env}.pt'}",
        "eval.policy=greedy",
        "eval.episodes=16",
        f"eval.record={gif}",
        "torch_threads=1",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    greedy = json.loads(result.stdout.strip().splitlines()[-1])["greedy"]
    assert greedy["episodes"] == 16 and greedy[metric] >= floor, greedy
    assert gif.read_bytes()[:6] in (b"GIF87a", b"GIF89a")


def test_the_committed_corridor_agent_takes_the_shortest_corridor(tmp_path):
    """A corridor of length 3 is 1 episode in 198 (a 100-episode evaluation can miss it), and
    its middle cell is the only one that sees the cue and the doors at once: an agent can hold
    success 0.99 while its greedy policy presses a wall there until the step limit (400 steps,
    as in training)."""
    command = [
        sys.executable,
        str(ROOT / "train_rl.py"),
        "mode=eval",
        f"checkpoint={ROOT / 'trained' / 'corridor.pt'}",
        "eval.policy=greedy",
        "eval.episodes=16",
        "env.min_length=3",
        "env.max_length=3",
        "env.max_steps=400",
        "torch_threads=1",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    greedy = json.loads(result.stdout.strip().splitlines()[-1])["greedy"]
    assert greedy["success"] == 1.0 and greedy["episode_length"] == 3.0, greedy
