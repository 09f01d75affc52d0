"""Fixtures that several test modules share, and the Hydra schema their configs need."""

import pytest
import torch

from training.schemas import register_schemas

register_schemas()  # (the tests compose the trainers' configs, as a trainer does once it starts)


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is fastest and immune to a busy second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
