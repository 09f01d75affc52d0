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
