"""Fixtures that several test modules share."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is fastest and immune to a busy second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
