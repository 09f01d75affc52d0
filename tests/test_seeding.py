"""Each environment's random stream (`training.seeding.env_seeds`): distinct across runs,
ranks, purposes and environments, and, through the real vector envs, runs on adjacent seeds
play different games."""

import numpy as np
import pytest

from agents.play import seeds_taken_by
from envs.registry import make_vector_env
from training.seeding import PURPOSES, env_seeds, rank_seed

NUM_ENVS = 8
STEPS = 200  # several episodes of a short Corridor

ENVS = {
    "corridor": {
        "name": "corridor",
        "id": "MazeBase/Corridor-v0",
        "min_length": 3,
        "max_length": 12,
        "max_steps": None,
    },
    "gym": {
        "name": "gym",
        "id": "CartPole-v1",
        "kwargs": {},
        "vectorization": "sync",
        "max_episode_steps": None,
    },
    "gym_batched": {  # CartPole's own vector env: one generator for the batch
        "name": "gym",
        "id": "CartPole-v1",
        "kwargs": {},
        "vectorization": "vector_entry_point",
        "max_episode_steps": None,
    },
    "popgym": {
        "name": "popgym",
        "id": "popgym:popgym-RepeatPreviousEasy-v0",
        "kwargs": {},
        "vectorization": "auto",
        "max_episode_steps": None,
    },
}


def test_the_seeds_of_many_runs_ranks_purposes_and_envs_are_pairwise_distinct():
    seeds = [
        value
        for seed in range(1000)
        for rank in range(2)
        for purpose in PURPOSES
        for value in env_seeds(seed, rank, 32, purpose)
    ]
    assert len(seeds) == 192_000
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= value < 2**64 for value in seeds)
    assert any(value >= 2**32 for value in seeds)  # 64-bit, not 32


def test_the_same_arguments_give_the_same_seeds_and_more_envs_extend_them():
    assert env_seeds(7, 1, 4, "eval") == env_seeds(7, 1, 4, "eval")
    assert env_seeds(7, 1, 8, "eval")[:4] == env_seeds(7, 1, 4, "eval")


def test_a_resumed_run_draws_streams_of_its_own_for_the_step_it_resumes_at():
    """For environments that save no state: new streams at each resume, none of them a new
    run's (`step=0`, whose seeds are those of a call without it)."""
    assert env_seeds(7, 0, 32, "train", step=0) == env_seeds(7, 0, 32, "train")
    drawn = [
        value
        for seed in (7, 8)
        for step in (0, 1, 16_000, 32_000)
        for value in env_seeds(seed, 0, 32, "train", step)
    ]
    drawn += env_seeds(7, 0, 32, "eval") + env_seeds(7, 1, 32, "train")
    assert len(set(drawn)) == len(drawn) == 10 * 32


@pytest.mark.parametrize(
    "seed, rank, purpose, message",
    [(-1, 0, "train", "non-negative"), (0, -1, "train", "non-negative"), (0, 0, "test", "purpose")],
)
def test_bad_seeding_arguments_are_refused(seed, rank, purpose, message):
    with pytest.raises(ValueError, match=message):
        env_seeds(seed, rank, 4, purpose)
    with pytest.raises(ValueError, match="step=-1"):
        env_seeds(0, 0, 4, "train", step=-1)


def test_rank_zero_keeps_the_seed_of_its_global_generators():
    assert rank_seed(5, 0) == 5
    assert rank_seed(5, 1) != rank_seed(5, 0)


def played(env: dict, seeds: list[int] | int) -> list[bytes]:
    """Each env's observations over `STEPS` steps from a reset with `seeds`, autoreset included,
    every env taking the same random actions: a fingerprint of the games it played."""
    if env["name"] == "popgym":
        pytest.importorskip("popgym")
    vec_env = make_vector_env(env, NUM_ENVS)
    obs, _ = vec_env.reset(
        seed=seeds_taken_by(vec_env, seeds) if isinstance(seeds, list) else seeds
    )
    history = [obs]
    vec_env.single_action_space.seed(0)
    for _ in range(STEPS):
        action = vec_env.single_action_space.sample()
        history.append(vec_env.step(np.full(NUM_ENVS, action))[0])
    vec_env.close()
    stacked = np.stack(history, axis=1)
    return [stacked[i].tobytes() for i in range(NUM_ENVS)]


@pytest.mark.parametrize("name", ENVS)
def test_runs_on_adjacent_seeds_play_different_games_for_every_purpose(name):
    for purpose in PURPOSES:
        games = played(ENVS[name], env_seeds(100, 0, NUM_ENVS, purpose))
        neighbour = played(ENVS[name], env_seeds(101, 0, NUM_ENVS, purpose))
        assert len(set(games) | set(neighbour)) == 2 * NUM_ENVS, purpose
        assert games == played(ENVS[name], env_seeds(100, 0, NUM_ENVS, purpose))
    if name == "gym_batched":
        return
    # Gymnasium's int seeds (env i: seed + i) would share all but one env's games
    shared = set(played(ENVS[name], 100)) & set(played(ENVS[name], 101))
    assert len(shared) == NUM_ENVS - 1
