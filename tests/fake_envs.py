"""A small fake Gymnasium env for each kind of observation and action space the agent takes,
registered on import as `FakeSpaces-v0`. From the command line (with this directory on
PYTHONPATH): env=gym env.id=fake_envs:FakeSpaces-v0 +env.kwargs.observation=KIND
+env.kwargs.action=KIND."""

import gymnasium as gym
import numpy as np
from gymnasium import spaces

FLOAT_VALUE = 0.37  # the first entry of every float observation, to see that it arrives as is

OBSERVATIONS = {
    "box_float": spaces.Box(-1.0, 1.0, (2, 3), np.float32),
    "image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
    "discrete": spaces.Discrete(5, start=1),
    "multi_discrete": spaces.MultiDiscrete([3, 4]),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (2,), np.float64))),
    "dict": spaces.Dict({"cue": spaces.MultiBinary(3), "position": spaces.Discrete(4)}),
}
ACTIONS = {
    "discrete": spaces.Discrete(3),
    "multi_discrete": spaces.MultiDiscrete([2, 3]),
    "box": spaces.Box(-1.0, 1.0, (1,), np.float32),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (1,), np.float32))),
}


class FakeSpacesEnv(gym.Env):
    """Episodes of ``length`` steps with random observations of the chosen kind; reward 1 for
    an action whose first component is 0. The last step reports `is_success` (the episode's
    rewards were all 1), as many Gymnasium envs do."""

    def __init__(self, observation: str = "box_float", action: str = "discrete", length: int = 5):
        self.observation_space = OBSERVATIONS[observation]
        self.action_space = ACTIONS[action]
        self.length = length

    def _observation(self):
        obs = self.observation_space.sample()
        if isinstance(self.observation_space, spaces.Box) and obs.dtype == np.float32:
            obs.flat[0] = FLOAT_VALUE
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.observation_space.seed(seed)
        self.t, self.rewarded = 0, 0
        return self._observation(), {}

    def step(self, action):
        self.t += 1
        reward = float(np.ravel(action)[0] == 0)
        self.rewarded += int(reward)
        terminated = self.t == self.length
        info = {"is_success": self.rewarded == self.length} if terminated else {}
        return self._observation(), reward, terminated, False, info


gym.register(id="FakeSpaces-v0", entry_point=FakeSpacesEnv)


class ConstantRewardEnv(gym.Env):
    """Reward 1 at every step and an observation that never changes; only a step limit
    (``max_episode_steps``) ends an episode, so its true value is 1 / (1 - gamma) in every
    state, as if episodes never ended."""

    observation_space = spaces.Box(0.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


def constant_reward_vector_env(num_envs: int, max_episode_steps: int = 4):
    """A vector env that resets in the step after an episode's end (Gymnasium's next-step
    autoreset) and takes no autoreset_mode, as CartPole's own vector env."""
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make("ConstantReward-v0", max_episode_steps=max_episode_steps)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )


gym.register(
    id="ConstantReward-v0",
    entry_point=ConstantRewardEnv,
    vector_entry_point=constant_reward_vector_env,
    max_episode_steps=4,
)


class TargetVectorEnv(gym.vector.VectorEnv):
    """Continuous control in its smallest form: each episode of ``length`` steps draws a
    target in {-0.5, 0.5} and shows it, times 100, in an unbounded observation (beside the
    step count times 50: features of unknown scale); every step pays -(action - target)^2 for
    a Box(-1, 1) action. Batched, resetting in the step that ends an episode, with a
    state_dict, so a run on it resumes exactly."""

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int, length: int = 5):
        self.num_envs, self.length = num_envs, length
        self.single_observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self.rng = np.random.default_rng()
        self.t = np.zeros(num_envs, np.int64)
        self.target = np.zeros(num_envs, np.float32)

    def _observe(self):
        return np.stack([self.target * 100, self.t * 50.0], axis=1).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        self.rng = np.random.default_rng(seed)
        self.t[:] = 0
        self.target = self.rng.choice([-0.5, 0.5], self.num_envs).astype(np.float32)
        return self._observe(), {}

    def step(self, actions):
        reward = -((np.asarray(actions)[:, 0] - self.target) ** 2)
        self.t += 1
        ended = self.t == self.length
        info = {}
        if ended.any():
            info = {"final_obs": self._observe(), "_final_obs": ended.copy()}
            self.t[ended] = 0
            self.target[ended] = self.rng.choice([-0.5, 0.5], int(ended.sum()))
        return self._observe(), reward.astype(np.float64), ended, np.zeros_like(ended), info

    def state_dict(self):
        return {
            "t": self.t.copy(),
            "target": self.target.copy(),
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, saved):
        self.t, self.target = saved["t"].copy(), saved["target"].copy()
        self.rng.bit_generator.state = saved["rng"]


class TargetEnv(gym.Env):
    """One environment of `TargetVectorEnv`."""

    def __init__(self, length: int = 5):
        self.batch = TargetVectorEnv(1, length)
        self.observation_space = self.batch.single_observation_space
        self.action_space = self.batch.single_action_space

    def reset(self, *, seed=None, options=None):
        obs, info = self.batch.reset(seed=seed)
        return obs[0], info

    def step(self, action):
        obs, reward, terminated, truncated, _ = self.batch.step(np.asarray(action)[None])
        return obs[0], float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}


gym.register(id="Target-v0", entry_point=TargetEnv, vector_entry_point=TargetVectorEnv)


class SpikeEnv(gym.Env):
    """Episodes of ``length`` steps that pay 1 for action 0, but return ``spike`` (a huge or a
    non-finite value) as the reward, or in the observation (``spiked="observation"``), at the
    ``at``-th step since the env was made: 1e30 makes a learner's value loss overflow at that
    step's update, NaN is an env's fault."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, at: int = 25, spike: float = 1e30, spiked: str = "reward", length: int = 5):
        self.at, self.spike, self.spiked, self.length = at, spike, spiked, length
        self.made_steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t, self.made_steps = self.t + 1, self.made_steps + 1
        obs, reward = np.zeros(2, np.float32), float(action == 0)
        if self.made_steps == self.at and self.spiked == "observation":
            obs[1] = self.spike
        elif self.made_steps == self.at:
            reward = self.spike
        return obs, reward, self.t == self.length, False, {}


gym.register(id="Spike-v0", entry_point=SpikeEnv)
