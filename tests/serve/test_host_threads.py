"""`kiln serve --host-threads`: torch's CPU threads in a server process (one by default when engines run on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kiln.cli.serve import _set_host_threads


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_an_explicit_count_is_set_and_the_cpu_default_is_left_alone(threads, monkeypatch):
    torch.set_num_threads(2)
    _set_host_threads(0, "cpu")
    assert torch.get_num_threads() == 2
    _set_host_threads(1, "cpu")
    assert torch.get_num_threads() == 1


def test_a_gpu_server_defaults_to_one_thread(threads, monkeypatch):
    torch.set_num_threads(2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    _set_host_threads(0, "auto")
    assert torch.get_num_threads() == 1
