"""bench tests run torch on one intra-op thread (as `bench run --threads 1` measures): the CPU stand-in runs
many small ops, and on a small shared machine a second thread mostly adds synchronisation stalls."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
