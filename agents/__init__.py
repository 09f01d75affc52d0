"""Actor-critic agents on the memory core (`ActorCritic`), the baseline cores (`RecurrentCore`:
LSTM, GRU; `FeedForwardCore`: no memory) and the observation encoders (`make_encoder`)."""

from agents.actor_critic import ActorCritic
from agents.encoders import make_encoder, map_observation
from agents.feedforward import FEEDFORWARD_KIND, FeedForwardCore
from agents.recurrent import RECURRENT_KINDS, RecurrentCore, RecurrentState

BASELINE_KINDS = (*RECURRENT_KINDS, FEEDFORWARD_KIND)  # the cores that are not memory transformers

__all__ = [
    "BASELINE_KINDS",
    "FEEDFORWARD_KIND",
    "RECURRENT_KINDS",
    "ActorCritic",
    "FeedForwardCore",
    "RecurrentCore",
    "RecurrentState",
    "make_encoder",
    "map_observation",
]
