"""A recorded episode (`agents.evaluation.record_episode`) shows under every frame what each
layer of a memory transformer still keeps: the cells agree with the memories' spans."""

from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image
from tiny_rl import TINY_RL

from agents.build import build_agent
from agents.evaluation import GIF_FRAME_MS, STRIP_GAP, memory_strip, record_episode, strip_cells
from envs.registry import make_env

ROOT = Path(__file__).resolve().parents[1]
MAX_SPAN, RAMP = 16, 2
LONG_EPISODES = ["env.min_length=10", "env.max_length=12"]  # up to 24 steps


def tiny_agent(*overrides):
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        cfg = compose("rl", overrides=[*TINY_RL, *LONG_EPISODES, *overrides])
    single = make_env(cfg.env)
    agent = build_agent(cfg, single.observation_space, single.action_space)
    single.close()
    return agent, cfg


def set_spans(monkeypatch, kind, later: float, first: float | None = None) -> None:
    """The layer's kind gives every memory written in step mode the span ``later``, but the
    episode's first (``first``, where given): the Corridor's first step sees the cue."""
    spans = iter([] if first is None else [first])

    def span(hidden):
        return hidden.new_full((hidden.shape[0], 1), next(spans, later))

    monkeypatch.setattr(kind, "span", span)


def expected_cells(spans: list[float], frame: int) -> list[bool]:
    """Memory j (of step j) is still seen by the query after `frame` steps, at age frame - j,
    while its mask 1 + (e_j - age) / R is above 0 (eq. 5)."""
    return [frame - j < spans[j] + RAMP for j in range(frame)]


def cell_shades(frame: np.ndarray, height: int, layers: int, steps: int) -> list[list[str]]:
    """The shade of each cell of the strip under a frame `height` pixels tall, read at cell
    centres: "kept" (dark), "lost" (light grey) or "blank" (white: a step still to come)."""
    side, per_line = strip_cells(steps, frame.shape[1])
    band = -(-steps // per_line) * side + STRIP_GAP
    shades = []
    for layer in range(layers):
        row = []
        for step in range(steps):
            line, column = divmod(step, per_line)
            y = height + layer * band + line * side + side // 2 - 1
            level = frame[y, column * side + side // 2 - 1].mean()
            row.append("kept" if level < 100 else "lost" if level < 240 else "blank")
        shades.append(row)
    return shades


def test_the_strip_draws_a_cell_per_step_and_wraps_a_long_episode():
    kept = np.array([[True, False, True], [False, False, True]])
    strip = memory_strip(kept, steps=5, width=100)  # cells of 16 pixels, all on one line
    assert strip.shape == (48, 100, 3) and strip.dtype == np.uint8  # 2 x (16 + gap), in 16s
    centres = strip[[7, 16 + STRIP_GAP + 7]][:, 7::16][:, :5].mean(-1)
    assert (centres[kept.nonzero()] < 100).all()
    assert ((centres[(~kept).nonzero()] > 100) & (centres[(~kept).nonzero()] < 240)).all()
    assert (centres[:, 3:] == 255).all()  # steps 3 and 4 still to come

    assert strip_cells(steps=100, width=60) == (3, 20)  # the least cell: 5 lines of 20
    wrapped = memory_strip(np.ones((1, 57), bool), steps=100, width=60)
    assert wrapped.shape == (32, 60, 3)  # 5 x 3 + gap, in 16s
    assert wrapped[2 * 3 + 1, 16 * 3 + 1].mean() < 100  # step 56: line 2, column 16
    assert wrapped[2 * 3 + 1, 17 * 3 + 1].mean() == 255  # step 57: to come


def test_a_recording_shows_each_layer_keeping_what_the_spans_say(monkeypatch, tmp_path):
    """Layer 0 gives every memory 2.5 steps, layer 1 the cue's (the first step's) L and the
    others 0.5: layer 1 keeps the cue while the memories after it expire. The .txt and the
    .gif show it frame by frame as eq. 5 says, not as the code under test reads `alive`."""
    agent, cfg = tiny_agent(f"memory.max_span={MAX_SPAN}", f"memory.ramp={RAMP}")
    trace, gif = tmp_path / "episode.txt", tmp_path / "episode.gif"
    for path in (trace, gif):  # (the same episode: the same seed, greedy)
        set_spans(monkeypatch, agent.core.layers[0].kind, later=2.5)
        set_spans(monkeypatch, agent.core.layers[1].kind, later=0.5, first=MAX_SPAN)
        record_episode(agent, cfg.env, path, seed=3, greedy=True)
    frames = trace.read_text().split("\n\n")
    steps = len(frames) - 1
    assert steps > MAX_SPAN + RAMP  # long enough for the cue's memory to expire too
    spans = [[2.5] * steps, [MAX_SPAN] + [0.5] * (steps - 1)]
    for k, frame in enumerate(frames):
        lines = frame.splitlines()[-2:]
        for layer, line in enumerate(lines):
            cells = "".join("#" if kept else "." for kept in expected_cells(spans[layer], k))
            assert line == f"layer {layer} memory: {cells}".rstrip(), (k, layer)
    assert frames[MAX_SPAN].splitlines()[-1].endswith("#" + "." * (MAX_SPAN - 3) + "##")

    pictures = iio.imread(gif, index=None)
    with Image.open(gif) as shown:  # (every frame for GIF_FRAME_MS, looping)
        assert shown.info["duration"] == GIF_FRAME_MS and shown.info["loop"] == 0
    env = make_env(cfg.env, render_mode="rgb_array")
    env.reset(seed=0)
    height = env.render().shape[0]  # (the strip goes under it)
    assert len(pictures) == len(frames)
    for k, picture in enumerate(pictures):
        shades = cell_shades(picture, height, 2, steps)
        for layer in range(2):
            cells = expected_cells(spans[layer], k)
            wanted = ["kept" if kept else "lost" for kept in cells] + ["blank"] * (steps - k)
            assert shades[layer] == wanted, (k, layer)


@pytest.mark.parametrize("memory", ["gru", "transformer_xl"])
def test_a_gru_records_bare_frames_and_transformer_xl_its_last_steps(tmp_path, memory):
    """A GRU keeps no memories to show; Transformer-XL keeps its last L = 4 steps."""
    agent, cfg = tiny_agent(f"memory={memory}", "memory.max_span=4")
    record_episode(agent, cfg.env, tmp_path / "episode.txt", seed=3, greedy=True)
    frames = (tmp_path / "episode.txt").read_text().split("\n\n")
    last = frames[-1].splitlines()[-1]
    if memory == "gru":
        assert all("memory:" not in frame for frame in frames)
    else:
        assert last == "layer 1 memory: " + "." * (len(frames) - 5) + "####"
