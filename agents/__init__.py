"""Actor-critic agents on the memory core (`ActorCritic`) and the LSTM baseline core."""

from agents.actor_critic import ActorCritic
from agents.lstm_core import LSTMCore

__all__ = ["ActorCritic", "LSTMCore"]
