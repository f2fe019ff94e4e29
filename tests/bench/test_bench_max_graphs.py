"""kiln bench --max-cuda-graphs: checked, and handed to every context."""

from __future__ import annotations

import pytest

from kiln.bench.session import BenchOptions
from kiln.errors import ConfigError
from test_cli import invoke


def test_max_cuda_graphs_is_checked():
    with pytest.raises(ConfigError, match="--max-cuda-graphs"):
        BenchOptions(max_cuda_graphs=-1).checked()
    assert BenchOptions(max_cuda_graphs=0).checked().max_cuda_graphs == 0


def test_bench_help_names_it():
    assert "--max-cuda-graphs" in invoke("bench", "--help").output
