"""Fixtures that several test modules share, and the Hydra schema their configs need."""

import os

import pytest
import torch

from training.schemas import register_schemas

register_schemas()  # (the tests compose the trainers' configs, as a trainer does once it starts)

# Under pytest-xdist each worker takes its share of the cores, and so do the trainers it runs in
# this process (torch_threads=auto reads OMP_NUM_THREADS) or starts: OpenMP threads beyond the
# cores spin against each other, and tiny tensors then take many times longer.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1:
    share = max(1, torch.get_num_threads() // WORKERS)
    torch.set_num_threads(share)
    os.environ["OMP_NUM_THREADS"] = str(share)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The learning runs (`learning`) first: the suite's longest tests, started near its end, would
    keep one worker busy while the others have nothing left to run."""
    items.sort(key=lambda item: item.get_closest_marker("learning") is None)  # (a stable sort)


@pytest.fixture
def one_thread():
    """Tiny tensors: one thread is fastest and immune to a busy second core."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
