"""/metrics reports GPU memory (issue 24, observability): per GPU this process uses, read at each scrape; nothing
where CUDA was never started, and a scrape never starts it."""

from __future__ import annotations

import pytest
import torch

from kiln.serve.metrics import MULTIPROCESS_ENV, Metrics


def _values(text: str) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
            if line.startswith("kiln_gpu_memory")}


def test_gpu_memory_is_read_at_each_scrape(monkeypatch, tmp_path):
    reserved = {0: 8 << 20, 1: 0, 2: 4 << 20}
    state = {"allocated": 5 << 20}
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: reserved[i])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: state["allocated"] if i == 0 else 1 << 20)
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: asked.append(i) or (60 << 30, 80 << 30))
    metrics = Metrics()
    got = _values(metrics.render().decode())
    assert got['kiln_gpu_memory_allocated_bytes{gpu="0"}'] == 5 << 20
    assert got['kiln_gpu_memory_reserved_bytes{gpu="2"}'] == 4 << 20
    assert got['kiln_gpu_memory_used_bytes{gpu="0"}'] == 20 << 30
    assert got['kiln_gpu_memory_total_bytes{gpu="0"}'] == 80 << 30
    assert not any('gpu="1"' in k for k in got) and 1 not in asked  # no memory there: no context started there
    state["allocated"] = 7 << 20
    assert _values(metrics.render().decode())['kiln_gpu_memory_allocated_bytes{gpu="0"}'] == 7 << 20
    monkeypatch.setenv(MULTIPROCESS_ENV, str(tmp_path))  # --workers / --frontends: the answering process's GPUs
    assert _values(metrics.render().decode())['kiln_gpu_memory_total_bytes{gpu="2"}'] == 80 << 30


def test_no_gpu_memory_where_cuda_never_started(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: pytest.fail("a scrape must not start CUDA"))
    text = Metrics().render().decode()
    assert "kiln_gpu_memory" not in text and "kiln_inference_requests_total" in text


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; none is visible on this machine")
def test_gpu_memory_counts_a_real_allocation():
    x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    got = _values(Metrics().render().decode())
    gpu = str(torch.cuda.current_device())
    assert got[f'kiln_gpu_memory_allocated_bytes{{gpu="{gpu}"}}'] >= x.numel()
    assert got[f'kiln_gpu_memory_used_bytes{{gpu="{gpu}"}}'] >= got[f'kiln_gpu_memory_reserved_bytes{{gpu="{gpu}"}}']
    del x
