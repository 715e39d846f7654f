import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """The models here are tiny: one thread is faster than two fighting for the cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
