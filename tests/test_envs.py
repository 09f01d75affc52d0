"""The MazeBase environments (Corridor, Portal), their batched core and the MiniGrid wrapper."""

from __future__ import annotations

import copy
import warnings
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env, data_equivalence
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import envs
from envs.demo import ScriptedCorridorPolicy, ScriptedPortalPolicy
from envs.registry import NAMED_ENVS

UP, RIGHT, DOWN, LEFT = range(4)
CORRIDOR = "MazeBase/Corridor-v0"
PORTAL = "MazeBase/Portal-v0"
MEMORY_TASKS = (
    "MiniGrid-MemoryS7-v0",
    "MiniGrid-MemoryS9-v0",
    "MiniGrid-MemoryS11-v0",
    "MiniGrid-MemoryS13-v0",
    "MiniGrid-MemoryS13Random-v0",
    "MiniGrid-MemoryS17Random-v0",
)


def words(env: gym.Env, cell: np.ndarray) -> set[str]:
    return {env.get_wrapper_attr("vocab")[i] for i in np.flatnonzero(cell)}


def make_vec(env_id: str, num_envs: int, **kwargs) -> gym.vector.VectorEnv:
    return gym.make_vec(
        env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs
    )


# --- Gymnasium API ---------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", [CORRIDOR, PORTAL])
def test_check_env_passes_without_warnings(env_id):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(gym.make(env_id).unwrapped)  # also makes and checks every render mode


def test_spaces_vocab_and_action_names():
    corridor = gym.make(CORRIDOR)
    assert corridor.observation_space == gym.spaces.Box(0, 1, (3, 3, 6), np.uint8)
    assert corridor.action_space == gym.spaces.Discrete(4)
    assert corridor.unwrapped.vocab == ["agent", "block", "cue", "door", "red", "blue"]
    assert corridor.unwrapped.action_names == ("up", "right", "down", "left")
    portal = gym.make(PORTAL, num_rooms=4, colors=("red", "blue", "green"))
    assert portal.unwrapped.vocab == [
        "agent", "block", "door", "red", "blue", "green", "room_0", "room_1", "room_2", "room_3"
    ]  # fmt: skip
    assert portal.observation_space.shape == (3, 3, 10)


def test_make_vec_takes_autoreset_mode_as_a_keyword():
    vec = make_vec(CORRIDOR, 3, autoreset_mode=AutoresetMode.SAME_STEP, max_length=10)
    assert isinstance(vec, envs.CorridorVectorEnv)
    assert vec.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    assert vec.observation_space.shape == (3, 3, 3, 6)
    assert make_vec(PORTAL, 2).metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
    assert make_vec(PORTAL, 2, autoreset_mode="SameStep").autoreset_mode is AutoresetMode.SAME_STEP


# --- Corridor --------------------------------------------------------------------------------


def test_corridor_cue_seen_at_reset_and_out_of_sight_two_steps_east():
    env = gym.make(CORRIDOR, min_length=10, max_length=10)
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        cue = words(env, obs[0, 1])
        assert cue in ({"cue", "red"}, {"cue", "blue"})
        assert words(env, obs[1, 1]) == {"agent"}
        assert words(env, obs[1, 0]) == {"block"}  # west of the start
        assert all(words(env, obs[2, col]) == {"block"} for col in range(3))
        obs, *_ = env.step(UP)  # the cue is solid
        assert words(env, obs[0, 1]) == cue
        obs, *_ = env.step(RIGHT)
        assert words(env, obs[0, 0]) == cue
        obs, *_ = env.step(RIGHT)
        assert not any("cue" in words(env, cell) for cell in obs.reshape(9, -1))


@pytest.mark.parametrize("take_matching_door", [True, False])
def test_corridor_doors_pay_for_the_cue_colour(take_matching_door):
    env = gym.make(CORRIDOR, min_length=3, max_length=12)
    for seed in range(10):
        obs, _ = env.reset(seed=seed)
        (cue_color,) = words(env, obs[0, 1]) - {"cue"}
        for _ in range(env.unwrapped.core.length[0] - 1):
            obs, reward, terminated, truncated, info = env.step(RIGHT)
            assert (reward, terminated, truncated, info) == (0.0, False, False, {})
        north, south = words(env, obs[0, 1]), words(env, obs[2, 1])
        assert sorted([sorted(north), sorted(south)]) == [["blue", "door"], ["door", "red"]]
        assert words(env, obs[1, 2]) == {"block"}  # the east end
        matching = UP if cue_color in north else DOWN
        action = matching if take_matching_door else UP + DOWN - matching
        obs, reward, terminated, truncated, info = env.step(action)
        assert reward == float(take_matching_door) and terminated and not truncated
        length = int(env.unwrapped.core.length[0])
        colors = env.unwrapped.core.cell_kinds.colors
        assert info == {
            "success": take_matching_door,
            "corridor_length": length,
            "cue_color": colors.index(cue_color),
            "good_door_north": cue_color in north,
        }
        door_color = (north if action == UP else south) - {"door"}
        assert words(env, obs[1, 1]) == {"agent", "door", *door_color}


def test_corridor_scripted_policy_always_wins():
    env = gym.make(CORRIDOR)
    policy = ScriptedCorridorPolicy(env.unwrapped.vocab)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        policy.reset()
        done, steps = False, 0
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy.act(obs))
            done, steps = terminated or truncated, steps + 1
        assert terminated and info["success"] and reward == 1.0
        assert steps == env.unwrapped.core.length[0]  # walking straight needs `length` steps


def play_portal(policy: ScriptedPortalPolicy, seeds: range, **kwargs) -> list[dict]:
    """One episode of Portal per seed with ``policy``: its outcome and how it ended."""
    env = gym.make(PORTAL, **kwargs)
    outcomes = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        policy.reset()
        done, episode_return = False, 0.0
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy.act(obs))
            done, episode_return = terminated or truncated, episode_return + reward
        outcomes.append({**info, "return": episode_return, "terminated": terminated})
    return outcomes


def test_portal_explorer_with_memory_never_errs_twice_and_reaches_the_last_room():
    vocab = gym.make(PORTAL, num_rooms=6).unwrapped.vocab
    policy = ScriptedPortalPolicy(vocab, memory=True, rng=np.random.default_rng(0))
    for outcome in play_portal(policy, range(20), num_rooms=6, max_steps=400):
        assert outcome["success"] and outcome["rooms_reached"] == 6
        # a good door of room k pays 0.1 k: at least rooms 1..5 once
        assert outcome["return"] >= 0.1 * sum(range(1, 6)) - 1e-9


def test_portal_explorer_without_memory_ends_on_a_second_mistake():
    vocab = gym.make(PORTAL).unwrapped.vocab
    policy = ScriptedPortalPolicy(vocab, memory=False, rng=np.random.default_rng(0))
    outcomes = play_portal(policy, range(40))
    assert all(o["terminated"] and not o["success"] for o in outcomes)
    # with a door chosen at random on every visit, a room is passed with probability 1/2
    assert 1.5 < np.mean([o["rooms_reached"] for o in outcomes]) < 4


def test_corridor_lengths_cover_the_range_and_the_layout_is_random():
    vec = make_vec(CORRIDOR, 4000)
    vec.reset(seed=0)
    core = vec.unwrapped.core
    assert set(core.length.tolist()) == set(range(3, 201))
    corridor_cells = (core.cells[:, 2] == core.cell_kinds.EMPTY).sum(axis=1)
    np.testing.assert_array_equal(corridor_cells, core.length)
    cue = core.cells[:, 1, 1]
    assert 0.45 < np.mean(cue == core.cell_kinds.cue[0]) < 0.55
    north = core.cells[np.arange(4000), 1, core.length]
    assert 0.45 < np.mean(core.cell_kinds.is_good_door[north]) < 0.55
    # the layout the episode info reports is the one on the map
    np.testing.assert_array_equal(core.cell_kinds.cue[core.cue_color], cue)
    np.testing.assert_array_equal(core.good_door_north, core.cell_kinds.is_good_door[north])


def test_corridor_step_limit_truncates():
    assert gym.make(CORRIDOR).unwrapped.core.max_steps == 400  # twice the longest corridor
    env = gym.make(CORRIDOR, min_length=5, max_length=5, max_steps=6)
    env.reset(seed=0)
    for _ in range(5):
        assert env.step(LEFT)[1:] == (0.0, False, False, {})
    *_, truncated, info = env.step(LEFT)
    assert truncated and info["success"] is False and info["corridor_length"] == 5


# --- Portal ----------------------------------------------------------------------------------


def walk_to_door(env: gym.Env, good: bool) -> tuple:
    """Walk from the entry of the current room into its good (or bad) door; returns the last
    step's result."""
    core = env.unwrapped.core
    kinds = core.cell_kinds
    east_wall = core.cells[0, core.room[0], :, -1]
    wanted = kinds.is_good_door[east_wall] == good
    door_row = np.flatnonzero(kinds.is_door[east_wall] & wanted)[0]
    entry_row = 1 + (core.room_size - 1) // 2
    vertical = [DOWN if door_row > entry_row else UP] * abs(door_row - entry_row)
    for action in [RIGHT] * (core.room_size - 1) + vertical + [RIGHT]:
        result = env.step(action)
    return result


def test_portal_rooms_rewards_mistakes_and_room_words():
    env = gym.make(PORTAL, num_rooms=5)
    obs, _ = env.reset(seed=1)
    assert words(env, obs[1, 1]) == {"agent", "room_0"}
    assert all(words(env, obs[row, 0]) == {"block"} for row in range(3))  # the west wall
    for k in (1, 2, 3):  # through the good doors of rooms 1..3 (counted from 1)
        obs, reward, terminated, truncated, info = walk_to_door(env, good=True)
        assert reward == pytest.approx(0.1 * k) and not (terminated or truncated) and info == {}
        assert words(env, obs[1, 1]) == {"agent", f"room_{k}"}
    obs, reward, terminated, _, info = walk_to_door(env, good=False)  # first mistake in room 4
    assert (reward, terminated, info) == (0.0, False, {})
    assert words(env, obs[1, 1]) == {"agent", "room_0"}
    for _ in range(3):
        walk_to_door(env, good=True)
    obs, reward, terminated, truncated, info = walk_to_door(env, good=False)  # second: the end
    assert reward == 0.0 and terminated and not truncated
    assert info == {"rooms_reached": 4, "success": False}
    assert words(env, obs[1, 1]) == {"agent", "room_0"}


def test_portal_second_mistake_in_the_first_room_ends_the_episode():
    env = gym.make(PORTAL)
    env.reset(seed=2)
    assert walk_to_door(env, good=False)[1:] == (0.0, False, False, {})
    assert walk_to_door(env, good=False)[1:] == (
        0.0, True, False, {"rooms_reached": 1, "success": False}
    )  # fmt: skip


def test_portal_reaching_the_last_room_ends_the_episode():
    env = gym.make(PORTAL, num_rooms=4, room_size=4)
    env.reset(seed=3)
    results = [walk_to_door(env, good=True) for _ in range(3)]
    assert [reward for _, reward, *_ in results] == pytest.approx([0.1, 0.2, 0.3])
    assert [terminated for _, _, terminated, *_ in results] == [False, False, True]
    obs, _, _, truncated, info = results[-1]
    assert not truncated and info == {"rooms_reached": 4, "success": True}
    assert words(env, obs[1, 1]) == {"agent", "room_3"}


def test_portal_truncates_after_1000_steps():
    env = gym.make(PORTAL)
    env.reset(seed=0)
    for _ in range(999):
        assert env.step(LEFT)[2:4] == (False, False)  # into the west wall
    assert env.step(LEFT)[1:] == (0.0, False, True, {"rooms_reached": 1, "success": False})


def test_portal_doors_are_distinct_and_hidden():
    vec = make_vec(PORTAL, 200)
    vec.reset(seed=0)
    core = vec.unwrapped.core
    kinds = core.cell_kinds
    east_walls = core.cells[:, :, 1:-1, -1]  # (envs, rooms, rows)
    assert (kinds.is_door[east_walls].sum(axis=-1) == 2).all()
    assert (kinds.is_good_door[east_walls].sum(axis=-1) == 1).all()
    color_index = np.array([kinds.colors.index(c) if c else -1 for _, c in kinds.kinds])
    door_colors = np.sort(np.where(kinds.is_door[east_walls], color_index[east_walls], -1))
    assert (door_colors[..., -2] != door_colors[..., -1]).all()  # two colours per room
    table = core.window.table
    np.testing.assert_array_equal(table[kinds.good_door], table[kinds.bad_door])


# --- Single env == batched core --------------------------------------------------------------

SMALL_GAMES = [
    (CORRIDOR, {"min_length": 2, "max_length": 7, "max_steps": 10}),
    (PORTAL, {"num_rooms": 3, "room_size": 3, "max_steps": 25, "colors": ("red", "blue")}),
]


@pytest.mark.parametrize("env_id, kwargs", SMALL_GAMES)
@pytest.mark.parametrize("mode", list(AutoresetMode))
def test_batched_core_matches_sync_vector_env_of_single_envs(env_id, kwargs, mode):
    """Same seeds and actions: same observations, rewards, ends and infos (with final_obs and
    final_info in SAME_STEP), through many autoresets."""
    num_envs = 6
    sync = SyncVectorEnv([lambda: gym.make(env_id, **kwargs)] * num_envs, autoreset_mode=mode)
    native = make_vec(env_id, num_envs, autoreset_mode=mode, **kwargs)
    assert native.metadata["autoreset_mode"] == sync.metadata["autoreset_mode"]
    assert data_equivalence(sync.reset(seed=7), native.reset(seed=7), exact=True)
    actions = np.random.default_rng(0).integers(0, 4, size=(300, num_envs))
    episodes = 0
    for step_actions in actions:
        expected, result = sync.step(step_actions), native.step(step_actions)
        assert data_equivalence(expected, result, exact=True)
        ended = result[2] | result[3]
        episodes += ended.sum()
        if mode == AutoresetMode.DISABLED and ended.any():
            mask = {"reset_mask": ended}
            expected, result = sync.reset(options=dict(mask)), native.reset(options=mask)
            assert data_equivalence(expected, result, exact=True)
    assert episodes > 50


def test_single_env_with_seed_s_plays_batched_env_with_seed_s():
    native = make_vec(PORTAL, 3, num_rooms=3)
    batch_obs, _ = native.reset(seed=[11, None, 5])
    single = gym.make(PORTAL, num_rooms=3)
    obs, _ = single.reset(seed=5)
    np.testing.assert_array_equal(obs, batch_obs[2])
    for action in np.random.default_rng(1).integers(0, 4, size=200):
        obs, reward, terminated, truncated, _ = single.step(action)
        batch = native.step(np.full(3, action))
        np.testing.assert_array_equal(obs, batch[0][2])
        assert (reward, terminated, truncated) == (batch[1][2], batch[2][2], batch[3][2])
        if terminated or truncated:
            break


@pytest.mark.parametrize("env_id", [CORRIDOR, PORTAL])
def test_same_seed_same_episode_other_seed_other_map(env_id):
    def episode(seed: int) -> list:
        env = gym.make(env_id)
        observations = [env.reset(seed=seed)[0]]
        for action in np.random.default_rng(0).integers(0, 4, size=100):
            obs, reward, terminated, truncated, _ = env.step(action)
            observations.append(obs)
            if terminated or truncated:
                break
        return observations + [env.unwrapped.core.cells.copy()]

    assert data_equivalence(episode(3), episode(3), exact=True)
    assert not data_equivalence(episode(3)[-1], episode(4)[-1], exact=True)


def _state_games():
    """Factories of 4-env vector envs that autoreset in the step: the two MazeBase games and a
    MiniGrid memory task."""
    same_step = AutoresetMode.SAME_STEP
    makers = [
        partial(make_vec, env_id, 4, autoreset_mode=same_step, **kw) for env_id, kw in SMALL_GAMES
    ]
    makers.append(partial(envs.make_minigrid_memory_vec, "MiniGrid-MemoryS7-v0", 4, same_step))
    return makers


@pytest.mark.parametrize("make", _state_games(), ids=["corridor", "portal", "minigrid"])
def test_a_vector_env_continues_from_its_state_dict(make):
    """Another vector env loaded with one's state_dict plays on exactly as that one does,
    through episode ends and resets (each env's generator is part of the state)."""
    rng = np.random.default_rng(0)
    played = make()
    played.reset(seed=3)
    for _ in range(30):
        played.step(rng.integers(0, 4, 4))
    resumed = make()
    resumed.reset(seed=99)  # a different start, overwritten by the state
    resumed.load_state_dict(played.state_dict())
    for _ in range(200):
        actions = rng.integers(0, 4, 4)
        assert data_equivalence(played.step(actions), resumed.step(actions))


def test_vector_step_before_reset_is_an_error():
    vec = make_vec(CORRIDOR, 3)
    with pytest.raises(gym.error.ResetNeeded, match=r"envs \[0, 1, 2\] have not been reset"):
        vec.step(np.full(3, RIGHT))
    vec.reset(seed=0, options={"reset_mask": np.array([True, False, True])})
    with pytest.raises(gym.error.ResetNeeded, match=r"envs \[1\]"):
        vec.step(np.full(3, RIGHT))
    vec.reset(seed=0)
    vec.step(np.full(3, RIGHT))


def test_vector_infos_follow_gymnasium_convention():
    native = make_vec(CORRIDOR, 4, min_length=2, max_length=2)  # one step east to the doors
    native.reset(seed=0)
    native.step(np.full(4, RIGHT))
    _, reward, terminated, _, info = native.step(np.array([UP, DOWN, LEFT, LEFT]))
    assert terminated.tolist() == [True, True, False, False]
    layout = ("corridor_length", "cue_color", "good_door_north")
    assert set(info) == {"success", "_success", *layout, *(f"_{key}" for key in layout)}
    assert info["success"].dtype == bool
    assert info["_success"].tolist() == [True, True, False, False]
    assert info["corridor_length"][:2].tolist() == [2, 2]
    np.testing.assert_array_equal(info["success"], reward == 1.0)
    _, reward, terminated, _, info = native.step(np.full(4, UP))  # NEXT_STEP: 0 and 1 restart
    assert reward.tolist() == [0.0] * 4 and not terminated.any() and info == {}


# --- Bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env_id, kwargs, error, message",
    [
        (CORRIDOR, {"min_length": 10, "max_length": 5}, ValueError, "max_length"),
        (CORRIDOR, {"min_length": 1}, ValueError, "min_length"),
        (CORRIDOR, {"min_length": 3.0}, TypeError, "integer"),
        (CORRIDOR, {"max_length": 50, "max_steps": 20}, ValueError, "max_steps"),
        (CORRIDOR, {"colors": ("red", "mauve")}, ValueError, "unknown colour"),
        (CORRIDOR, {"colors": "red"}, TypeError, "sequence"),
        (PORTAL, {"colors": ("red",)}, ValueError, "at least 2 colours"),
        (PORTAL, {"colors": ("red", "red", "blue")}, ValueError, "distinct"),
        (PORTAL, {"num_rooms": 1}, ValueError, "num_rooms"),
        (PORTAL, {"room_size": 1}, ValueError, "room_size"),
    ],
)
def test_bad_settings_are_refused_clearly(env_id, kwargs, error, message):
    with pytest.raises(error, match=message):
        gym.make(env_id, **kwargs)
    with pytest.raises(error, match=message):
        make_vec(env_id, 2, **kwargs)


def test_unknown_render_mode_is_refused():
    with pytest.raises(ValueError, match="render_mode"):
        envs.PortalEnv(render_mode="text")
    with pytest.raises(ValueError, match="render_mode"):
        make_vec(PORTAL, 2, render_mode="text")


@pytest.mark.parametrize("action", [4, -1, 1.0, "up", np.array([1])])
def test_single_env_refuses_bad_actions(action):
    env = gym.make(CORRIDOR).unwrapped
    env.reset(seed=0)
    with pytest.raises(ValueError, match="0..3"):
        env.step(action)


def test_single_env_refuses_steps_after_the_end():
    env = gym.make(CORRIDOR, min_length=2, max_length=2).unwrapped
    with pytest.raises(RuntimeError, match="reset"):
        env.step(RIGHT)
    env.reset(seed=0)
    env.step(RIGHT)
    assert env.step(UP)[2]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(DOWN)


@pytest.mark.parametrize(
    "actions, message",
    [
        (np.zeros(3, dtype=np.int64), "shape"),
        (np.zeros((4, 1), dtype=np.int64), "shape"),
        (np.array([0, 1, 2, 4]), "0..3"),
        (np.array([0, -1, 2, 3]), "0..3"),
        (np.zeros(4), "integers"),
    ],
)
def test_vector_env_refuses_bad_action_batches(actions, message):
    native = make_vec(CORRIDOR, 4)
    native.reset(seed=0)
    with pytest.raises(ValueError, match=message):
        native.step(actions)


def test_vector_env_refuses_bad_seeds_masks_and_modes():
    native = make_vec(
        CORRIDOR, 4, autoreset_mode=AutoresetMode.DISABLED, min_length=2, max_length=2
    )
    with pytest.raises(ValueError, match="one per env"):
        native.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="shape"):
        native.reset(options={"reset_mask": np.ones(3, dtype=bool)})
    native.reset(seed=0)
    native.step(np.full(4, RIGHT))
    native.step(np.array([UP, UP, LEFT, LEFT]))
    with pytest.raises(RuntimeError, match="reset_mask"):
        native.step(np.full(4, LEFT))
    with pytest.raises(ValueError, match="autoreset_mode"):
        make_vec(CORRIDOR, 2, autoreset_mode="sometimes")


# --- Rendering -------------------------------------------------------------------------------


def test_ansi_picture_shows_the_map_and_a_legend():
    env = gym.make(CORRIDOR, min_length=4, max_length=4, render_mode="ansi")
    obs, _ = env.reset(seed=0)
    (cue_color,) = words(env, obs[0, 1]) - {"cue"}
    lines = env.render().splitlines()
    assert lines[1:6] == [
        "######",
        f"#{cue_color[0]}##{lines[2][4]}#",
        "#@...#",
        f"####{lines[4][4]}#",
        "######",
    ]
    assert {lines[2][4], lines[4][4]} == {"R", "B"}
    assert "r/b cue (red/blue)" in lines[-1] and "R/B door (red/blue)" in lines[-1]


def test_rgb_frames_have_one_size_and_show_the_cue_and_the_agent():
    env = gym.make(CORRIDOR, max_length=30, render_mode="rgb_array")
    pixels = env.unwrapped.core.cell_pixels
    for seed in range(3):
        obs, _ = env.reset(seed=seed)
        frame = env.render()
        assert frame.shape == (5 * pixels, 32 * pixels, 3) and frame.dtype == np.uint8
        (cue_color,) = words(env, obs[0, 1]) - {"cue"}
        cue_tile = frame[pixels : 2 * pixels, pixels : 2 * pixels].reshape(-1, 3)
        assert (cue_tile == envs.COLORS[cue_color][1]).all(axis=1).any()
        agent_tile = frame[2 * pixels : 3 * pixels, pixels : 2 * pixels].reshape(-1, 3)
        assert (agent_tile == 255).all(axis=1).any()
    portal = gym.make(PORTAL, render_mode="rgb_array")
    portal.reset(seed=0)
    assert portal.render().shape == (7 * 32 + 16, 7 * 32, 3)
    native = make_vec(PORTAL, 3, render_mode="ansi")
    native.reset(seed=0)
    assert len(native.render()) == 3 and all("room_0" in text for text in native.render())


def test_record_video_writes_a_corridor_episode(tmp_path):
    pytest.importorskip("moviepy", reason='the video extra: pip install -e ".[video]"')
    env = gym.make(CORRIDOR, min_length=3, max_length=6, render_mode="rgb_array")
    env = gym.wrappers.RecordVideo(env, str(tmp_path / "videos"), disable_logger=True)
    env.reset(seed=0)
    for _ in range(12):
        if env.step(RIGHT)[3]:
            break
    env.close()
    assert [path.suffix for path in (tmp_path / "videos").iterdir()] == [".mp4"]


# --- MiniGrid memory tasks -------------------------------------------------------------------


def test_minigrid_wrapper_passes_check_env(monkeypatch):
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # check_env also opens the human render mode
    env = envs.make_minigrid_memory("MiniGrid-MemoryS9-v0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*different from the unwrapped version")
        # pygame's note that the machine lacks MiniGrid's font (it falls back to its own)
        warnings.filterwarnings("ignore", message="The system font .* couldn't be found")
        check_env(env)
    assert env.observation_space == gym.spaces.Box(0, 1, (5, 5, 15), np.uint8)
    assert env.action_space == gym.spaces.Discrete(4)


def test_minigrid_actions_are_cardinal_moves():
    """Action k faces direction k and steps forward: the agent moves one cell that way unless
    the cell is blocked, and every action is one MiniGrid step."""
    env = envs.make_minigrid_memory("MiniGrid-MemoryS13Random-v0")
    env.reset(seed=0)
    memory_env = env.unwrapped
    moves = {UP: (0, -1), RIGHT: (1, 0), DOWN: (0, 1), LEFT: (-1, 0)}
    positions = set()
    for step, action in enumerate(np.random.default_rng(0).integers(0, 4, size=60), start=1):
        x, y = (int(v) for v in memory_env.agent_pos)
        target = (x + moves[action][0], y + moves[action][1])
        cell = memory_env.grid.get(*target)
        expected = target if cell is None or cell.can_overlap() else (x, y)
        *_, terminated, truncated, _ = env.step(action)
        assert tuple(int(v) for v in memory_env.agent_pos) == expected
        assert memory_env.step_count == step
        positions.add(expected)
        if terminated or truncated:
            break
    assert len(positions) > 3


def test_minigrid_steps_as_with_the_view_built_at_every_step():
    """make_minigrid_memory skips MiniGrid's agent view after resets: observations, rewards,
    endings and infos stay those of the wrapper around MiniGrid's own env, over many episodes."""
    fast = envs.make_minigrid_memory("MiniGrid-MemoryS7-v0")
    plain = envs.MiniGridMemoryWrapper(gym.make("MiniGrid-MemoryS7-v0"))
    assert not isinstance(plain.unwrapped, type(fast.unwrapped))
    actions = np.random.default_rng(0).integers(0, 4, size=2000)
    episodes = 0
    for env in (fast, plain):
        env.reset(seed=3)
    for action in actions:
        fast_step, plain_step = fast.step(int(action)), plain.step(int(action))
        np.testing.assert_array_equal(fast_step[0], plain_step[0])
        assert fast_step[1:] == plain_step[1:]
        if fast_step[2] or fast_step[3]:
            episodes += 1
            np.testing.assert_array_equal(fast.reset()[0], plain.reset()[0])
    assert episodes > 20


class MemoryOracle:
    """Reads only the observation: walks west to the start room's west wall, where the cue is
    in view, then east to the junction, and steps towards the end object that matches."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab, self.cue = vocab, None

    def act(self, obs: np.ndarray) -> int:
        centre = obs.shape[0] // 2
        cell = lambda row, col: {self.vocab[i] for i in np.flatnonzero(obs[row, col])}  # noqa: E731
        if self.cue is None:
            if "block" not in cell(centre, centre - 1):
                return LEFT
            self.cue = (cell(centre - 1, centre) & {"key", "ball"}).pop()
        if "block" not in cell(centre, centre + 1):
            return RIGHT
        return UP if self.cue in cell(0, centre) else DOWN


@pytest.mark.parametrize("env_id", MEMORY_TASKS)
def test_minigrid_memory_tasks_are_solvable_from_the_5x5_window(env_id):
    env = envs.make_minigrid_memory(env_id)
    for seed in range(4):
        obs, _ = env.reset(seed=seed)
        oracle, done = MemoryOracle(env.vocab), False
        while not done:
            obs, reward, terminated, truncated, info = env.step(oracle.act(obs))
            done = terminated or truncated
        assert terminated and info["success"] and reward > 0


def test_minigrid_3x3_window_never_shows_the_end_objects_before_the_choice():
    env = envs.make_minigrid_memory("MiniGrid-MemoryS11-v0", window_size=3)
    obs, _ = env.reset(seed=0)
    while "block" not in words(env, obs[1, 2]):  # east to the junction
        obs, *_ = env.step(RIGHT)
    seen = {word for cell in obs.reshape(9, -1) for word in words(env, cell)}
    assert not seen & {"key", "ball"}


def test_minigrid_memory_vec_reports_success_in_final_info():
    vec = envs.make_minigrid_memory_vec(
        "MiniGrid-MemoryS7-v0", 8, autoreset_mode=AutoresetMode.SAME_STEP
    )
    assert vec.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    vec.reset(seed=0)
    vec.action_space.seed(0)
    for _ in range(100):
        _, _, terminated, truncated, info = vec.step(vec.action_space.sample())
        if terminated.any():
            assert info["final_info"]["_success"][terminated].all()
            return
    pytest.fail("no episode ended in 100 random steps of MemoryS7")


def test_minigrid_wrapper_refuses_other_envs():
    with pytest.raises(TypeError, match="MiniGrid-MemoryS"):
        envs.MiniGridMemoryWrapper(gym.make("MiniGrid-Empty-5x5-v0"))
    with pytest.raises(ValueError, match="MiniGrid-MemoryS"):
        envs.make_minigrid_memory("MiniGrid-Empty-5x5-v0")


def test_the_env_registry_matches_the_env_configs():
    """Every configs/env/NAME.yaml has its registry entry and the other way round."""
    configs = Path(__file__).resolve().parents[1] / "configs"
    assert {path.stem for path in (configs / "env").glob("*.yaml")} == set(NAMED_ENVS)


@pytest.mark.parametrize("name", sorted(NAMED_ENVS))
def test_each_named_env_is_made_from_its_config(name):
    """Each named env is made, single and batched, from its config as it stands."""
    from hydra import compose, initialize_config_dir

    from envs.registry import make_env, make_vector_env

    if name == "popgym":
        pytest.importorskip("popgym", reason='the popgym extra: pip install -e ".[popgym]"')
    entry = NAMED_ENVS[name]
    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose("rl", overrides=[f"env={name}"])
    assert cfg.env.name == name
    single = make_env(cfg.env)
    vector = make_vector_env(cfg.env, 2)
    assert vector.single_observation_space == single.observation_space
    assert entry.metric is None or entry.metric in (*entry.outcomes, "return")
    single.close()
    vector.close()


@pytest.mark.parametrize("name", ["corridor", "portal"])
def test_the_agents_inputs_set_on_the_projects_envs_reach_the_agent_not_the_env(name):
    """`env.previous_action` and `env.previous_reward` on the paper's envs widen the agent's
    input by the action's one-hot and the reward, and the env is made without them."""
    from hydra import compose, initialize_config_dir

    from agents.build import build_agent
    from envs.registry import make_env

    configs = Path(__file__).resolve().parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        cfg = compose(
            "rl",
            overrides=[f"env={name}", "+env.previous_action=true", "+env.previous_reward=true"],
        )
    env = make_env(cfg.env)
    agent = build_agent(cfg, env.observation_space, env.action_space)
    assert agent.previous_width == env.action_space.n + 1
    env.close()


@pytest.mark.parametrize("env_id", ["MazeBase/Corridor-v0", "MazeBase/Portal-v0"])
def test_blocked_moves_are_the_actions_a_step_leaves_in_place(env_id):
    """`blocked_moves` says, before a step, which actions would not move each agent: for
    every game and action, a copy of the core stepped with it stays exactly where it was."""
    vec = gym.make_vec(env_id, num_envs=6, vectorization_mode="vector_entry_point")
    vec.reset(seed=3)
    rng, seen = np.random.default_rng(0), []
    for _ in range(40):
        core = vec.unwrapped.core
        blocked = core.blocked_moves()
        for action in range(4):
            trial = copy.deepcopy(core)
            trial.step(np.full(6, action))
            assert np.array_equal(trial.position == core.position, blocked[:, action])
        seen.append(blocked)
        vec.step(rng.integers(0, 4, 6))
    vec.close()
    assert np.stack(seen).any() and not np.stack(seen).all()
