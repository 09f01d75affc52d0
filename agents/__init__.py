"""Actor-critic agents on the memory core (`ActorCritic`), the recurrent baseline cores
(`RecurrentCore`: LSTM, GRU) and the observation encoders (`make_encoder`)."""

from agents.actor_critic import ActorCritic
from agents.encoders import make_encoder, map_observation
from agents.recurrent import RECURRENT_KINDS, RecurrentCore, RecurrentState

__all__ = [
    "RECURRENT_KINDS",
    "ActorCritic",
    "RecurrentCore",
    "RecurrentState",
    "make_encoder",
    "map_observation",
]
